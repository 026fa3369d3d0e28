"""Tiny Llama-style models and a character tokenizer, made locally (never from a hub).

The default run and every test start from these: a real transformer small enough to
train and serve on two CPU cores, with head_dim 64 because vLLM's CPU attention
kernels reject smaller heads. The tokenizer is character-level so that arithmetic is
spelled digit by digit and every id the model can emit decodes to exactly one
character.

Weights are saved in float32: the model is ~0.5M parameters (2 MB), so precision is
free, and whoever loads it -- a float32 trainer or a bfloat16 rollout engine -- starts
from the same warm-started values, cast once at load time.

torch and transformers are imported inside the functions that need them, so code
that only tokenizes (workflows, the launcher) stays torch-free.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenizers import Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as FastTokenizer

from astraflow.config import ModelConfig
from astraflow.text import TextTokenizer, load_tokenizer
from astraflow.types import Task
from astraflow.weights._fs import build_dir

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIALS = (PAD, BOS, EOS)
#: digits and operators for arithmetic, lower-case letters and punctuation for tool
#: calls and verdicts (``calc(3+4)``, ``yes``/``no``, ``answer: 7``)
CHARACTERS = "0123456789+-*/=()" + " \n:,." + "abcdefghijklmnopqrstuvwxyz"
#: the tiny model's chat format, in its own characters: a user turn is its text, an
#: answer ends with <eos>, a tool call is written ``name(argument)`` and its result comes
#: back as ``=RESULT,`` (the format of ``workflow=tool_use``). A single user message
#: renders as its bare text, so plain prompts tokenize as they always did.
CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}"
    "{{- m.content or '' -}}"
    "{%- if m.tool_calls -%}"
    "{%- for call in m.tool_calls -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{{- fn.name }}({% for v in fn.arguments.values() %}{{ v }}{% endfor %})"
    "{%- endfor -%}"
    "{%- else -%}{{- eos_token -}}{%- endif -%}"
    "{%- elif m.role == 'tool' -%}={{ m.content }},"
    "{%- else -%}{{- m.content -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
)
#: bump when the construction below changes, so cached models are rebuilt
_FORMAT = 2
_STAMP = "astraflow_tiny.json"
_WARMSTART_LR = 3e-4
_WARMSTART_BATCH = 32


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The character tokenizer as a ``transformers`` tokenizer (saved with the model)."""
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate([*SPECIALS, *CHARACTERS])}
    core = FastTokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, bos_token=BOS, eos_token=EOS
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _llama_config(model_cfg: ModelConfig, vocab_size: int) -> Any:
    from transformers import LlamaConfig

    if model_cfg.hidden_size % model_cfg.num_heads:
        raise ValueError(
            f"model.hidden_size={model_cfg.hidden_size} is not divisible by "
            f"model.num_heads={model_cfg.num_heads}"
        )
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=model_cfg.hidden_size,
        intermediate_size=model_cfg.intermediate_size,
        num_hidden_layers=model_cfg.num_layers,
        num_attention_heads=model_cfg.num_heads,
        num_key_value_heads=model_cfg.num_heads,
        head_dim=model_cfg.hidden_size // model_cfg.num_heads,
        max_position_embeddings=model_cfg.max_position_embeddings,
        tie_word_embeddings=False,
        pad_token_id=SPECIALS.index(PAD),
        bos_token_id=SPECIALS.index(BOS),
        eos_token_id=SPECIALS.index(EOS),
    )


def _fingerprint(model_cfg: ModelConfig, seed: int, tasks: Sequence[Task]) -> dict[str, Any]:
    arch = {k: v for k, v in asdict(model_cfg).items() if k != "path"}
    pairs = [[t.prompt, t.answer or ""] for t in tasks] if model_cfg.warmstart_steps else []
    digest = hashlib.sha256(json.dumps(pairs).encode()).hexdigest()
    return {
        "format": _FORMAT,
        "model": arch,
        "seed": seed,
        "characters": CHARACTERS,
        "warmstart": {"lr": _WARMSTART_LR, "batch": _WARMSTART_BATCH, "tasks_sha256": digest},
    }


def _stamp_matches(out_dir: Path, fingerprint: dict[str, Any]) -> bool:
    try:
        return json.loads((out_dir / _STAMP).read_text()) == fingerprint
    except (OSError, ValueError):
        return False


def make_tiny_model(
    out_dir: str | os.PathLike[str],
    model_cfg: ModelConfig,
    seed: int,
    warmstart_tasks: Sequence[Task] | None = None,
) -> str:
    """Build (or reuse) a tiny model in ``out_dir``; returns the directory.

    Random init with ``seed``, then ``model_cfg.warmstart_steps`` supervised steps on
    ``warmstart_tasks`` (prompt -> answer + <eos>) so RL starts from a weak policy
    that sometimes answers right instead of one that never does. The same config,
    seed and tasks always give the same weights; a directory already holding them is
    reused. The model is written to a temporary sibling and renamed into place, so
    concurrent callers never see a half-written model.
    """
    out = Path(out_dir)
    tasks = list(warmstart_tasks or [])
    if model_cfg.warmstart_steps and not tasks:
        raise ValueError(
            f"model.warmstart_steps={model_cfg.warmstart_steps} needs warmstart_tasks; "
            "pass the training tasks or set model.warmstart_steps=0"
        )
    fingerprint = _fingerprint(model_cfg, seed, tasks)
    if _stamp_matches(out, fingerprint):
        return str(out)
    if out.exists() and any(out.iterdir()) and not (out / _STAMP).exists():
        raise FileExistsError(f"{out} holds files but no tiny model; refusing to replace them")

    import torch
    from transformers import LlamaForCausalLM

    hf_tokenizer = build_tokenizer()
    torch.manual_seed(seed)
    model = LlamaForCausalLM(_llama_config(model_cfg, len(hf_tokenizer))).float()

    def write(tmp: Path) -> None:
        hf_tokenizer.save_pretrained(tmp)
        if model_cfg.warmstart_steps:
            _warmstart(model, load_tokenizer(tmp), tasks, model_cfg, seed)
        model.save_pretrained(tmp)
        (tmp / _STAMP).write_text(json.dumps(fingerprint, indent=2))

    build_dir(out, write, lambda d: _stamp_matches(d, fingerprint))
    return str(out)


def _warmstart(
    model: Any, tokenizer: TextTokenizer, tasks: list[Task], model_cfg: ModelConfig, seed: int
) -> None:
    """Supervised steps on answer + <eos> tokens only (the prompt is context)."""
    eos = tokenizer.eos_token_id
    examples = [
        (tokenizer.encode(str(task.prompt)), [*tokenizer.encode(task.answer or ""), eos])
        for task in tasks
    ]
    supervised_steps(model, examples, steps=model_cfg.warmstart_steps, lr=_WARMSTART_LR,
                     batch=_WARMSTART_BATCH, pad_token_id=tokenizer.pad_token_id, seed=seed)


def supervised_steps(
    model: Any,
    examples: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    steps: int,
    lr: float,
    batch: int,
    pad_token_id: int,
    seed: int,
) -> None:
    """AdamW steps on (prompt ids, target ids) pairs, the loss on target tokens only.

    Batches are drawn with replacement by ``random.Random(seed)``, so the same examples
    and seed train the same weights. Sequences are right-padded and the model is causal,
    so padding never reaches a trained position and no attention mask is needed.
    """
    import torch

    from astraflow.rl.losses import token_logprobs

    rows = [([*prompt, *target], [0] * len(prompt) + [1] * len(target))
            for prompt, target in examples]
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    for _ in range(steps):
        chosen = [rows[rng.randrange(len(rows))] for _ in range(batch)]
        width = max(len(ids) for ids, _ in chosen)
        ids = torch.tensor([s + [pad_token_id] * (width - len(s)) for s, _ in chosen])
        mask = torch.tensor([m + [0] * (width - len(m)) for _, m in chosen], dtype=torch.float32)
        logp = token_logprobs(model(input_ids=ids).logits, ids)
        loss = -(logp * mask).sum() / mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    model.eval()
