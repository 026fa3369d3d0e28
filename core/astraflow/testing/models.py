"""Tiny checkpoints of real Hugging Face layouts with real tokenizers, made locally.

The default run's tiny model has a character tokenizer whose pad is id 0 and whose one
EOS ends every answer. A user's checkpoint differs in each way that breaks assumptions:
a byte-level BPE where text and ids are not one-to-one, ChatML turns that end with
``<|im_end|>`` while the tokenizer's vocabulary also has ``<|endoftext|>``, special ids
at the end of the vocabulary, a chat template, tied embeddings, grouped KV heads, or a
word-level vocabulary with Llama's ``<s>``/``</s>``, an automatic BOS and no pad token.
These fixtures have each of those, so a test passing on them passes for the reasons a
real checkpoint needs -- without a hub, a download or a GPU.

Sizes suit two CPU cores and vLLM's CPU attention, which needs head_dim 64: hidden 128
with 2 heads, 2 layers. Weights are random (``seed``) and saved in float32.

Building is deterministic: the same arguments give byte-identical weights, and a
directory already holding them is reused. A stamp records the arguments and the
weights' hash, so a fixture trained in place (:func:`sft_warmstart`) is rebuilt rather
than mistaken for the untrained one. torch and transformers are imported inside the
functions, because the pytest plugin imports this module in torch-free sessions.
"""

from __future__ import annotations

import hashlib
import json
import operator
import os
import random
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from astraflow.weights._fs import build_dir

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

CHAT_ARCHS = ("qwen2", "qwen3", "llama", "mistral")
#: mixture-of-experts layouts: four experts, two routed to a token, in every layer
MOE_ARCHS = ("qwen3_moe", "mixtral")
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
#: added after the trained vocabulary, in Qwen's order, so their ids are the last three
CHAT_SPECIALS = (ENDOFTEXT, IM_START, IM_END)
UNK, BOS, EOS = "<unk>", "<s>", "</s>"
#: Qwen2's pre-tokenizer split (transformers' ``Qwen2Tokenizer``): digits one by one
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

#: ChatML as Qwen2.5 renders it, tools included, but with no default system line: a
#: system turn appears only when the conversation (or ``tools``) asks for one
CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages and messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' }}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and ' }}
    {{- 'arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n' }}
    {{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- elif messages and messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first)
          or (message.role == 'assistant' and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' }}
            {%- if tool_call.arguments is string %}
                {{- tool_call.arguments }}
            {%- else %}
                {{- tool_call.arguments | tojson }}
            {%- endif %}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

#: shared by every fixture: small enough for two cores, head_dim 64 for vLLM on CPU
_SHAPE: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "max_position_embeddings": 1024,
}
#: bump when the construction below changes, so cached fixtures are rebuilt
_FORMAT = 1
_STAMP = "astraflow_fixture.json"
_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def default_corpus() -> list[str]:
    """Text like the tests' prompts and answers, so the BPE's merges are ones they use.

    Arithmetic spelled as the tasks spell it (Qwen's split keeps digits single tokens),
    chat-style lines, tool calls and verdicts; the byte-level alphabet covers the rest.
    """
    rng = random.Random(0)
    lines = []
    for _ in range(240):
        a, b, op = rng.randrange(100), rng.randrange(100), rng.choice("+-*")
        lines.append(f"{a}{op}{b}={_OPS[op](a, b)}")
    for _ in range(120):
        a, b = rng.randrange(50), rng.randrange(50)
        right = rng.random() < 0.5
        claim = a + b if right else a + b + rng.choice((-2, -1, 1, 2))
        lines += [
            f"user: What is {a}+{b}? Answer with a number.",
            f"assistant: calc({a}+{b}) answer: {a + b}",
            f"Is {a}+{b}={claim} correct? Answer yes or no. {'yes' if right else 'no'}",
        ]
    lines += [*_CHAT_LINES, "yes no answer calc"] * 10
    return lines


_CHAT_LINES = (
    "You are a helpful assistant.",
    "Be brief.",
    "Hello! How can I help you today?",
    "Sure, here is the answer.",
    "Let me check that with the calculator first.",
    "Please think step by step and show your work.",
    "The final answer is the number after the equals sign.",
    "Is the following statement correct? Reply with yes or no only.",
    "Compute the sum, the difference or the product of two numbers.",
    "Thank you, that was very helpful.",
    "You may call one or more functions to assist with the user query.",
    "You are provided with function signatures within <tools></tools> XML tags:",
    "For each function call, return a json object with function name and arguments.",
    '<tool_call>{"name": "calc", "arguments": {"expression": "12+7"}}</tool_call>',
    "<tool_response>19</tool_response>",
)


def build_chat_tokenizer(corpus: Sequence[str], vocab_size: int,
                         context: int | None = None) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on ``corpus`` with ChatML specials as its last three ids.

    Its normalizer and pre-tokenizer are Qwen's (NFC, :data:`QWEN_SPLIT`, then bytes):
    ``transformers`` loads every ``qwen2`` checkpoint's tokenizer as ``Qwen2Tokenizer``,
    which rebuilds exactly that pipeline around the saved vocabulary and merges, so any
    other split would make ``AutoTokenizer`` and ``tokenizer.json`` disagree on the ids.
    The byte-level initial alphabet makes every text encodable whatever the corpus.
    ``vocab_size`` counts the specials; a corpus too small to yield that many merges is
    refused instead of silently giving a smaller vocabulary than the model's.
    """
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
    )
    from tokenizers.trainers import BpeTrainer
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + len(CHAT_SPECIALS):
        raise ValueError(
            f"vocab_size={vocab_size} is smaller than the byte alphabet ({len(alphabet)}) "
            f"plus the {len(CHAT_SPECIALS)} special tokens"
        )
    core = Tokenizer(models.BPE())
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    core.decoder = decoders.ByteLevel()
    core.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = BpeTrainer(
        vocab_size=vocab_size - len(CHAT_SPECIALS),
        initial_alphabet=alphabet,
        special_tokens=[],
        show_progress=False,
    )
    core.train_from_iterator(list(corpus), trainer)
    core.add_special_tokens(
        [AddedToken(tok, special=True, normalized=False) for tok in CHAT_SPECIALS]
    )
    if core.get_vocab_size() != vocab_size:
        raise ValueError(
            f"the corpus yields {core.get_vocab_size()} tokens, fewer than vocab_size="
            f"{vocab_size}: give more text or a smaller vocab_size"
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        chat_template=CHAT_TEMPLATE,
        model_max_length=context or _SHAPE["max_position_embeddings"],
    )


def _chat_config(arch: str, vocab_size: int, eos: int, pad: int,
                 context: int | None = None) -> Any:
    from transformers import (
        LlamaConfig,
        MistralConfig,
        MixtralConfig,
        Qwen2Config,
        Qwen3Config,
        Qwen3MoeConfig,
    )

    common = {
        **_SHAPE,
        "max_position_embeddings": context or _SHAPE["max_position_embeddings"],
        "vocab_size": vocab_size,
        "bos_token_id": None,
        "eos_token_id": eos,
        "pad_token_id": pad,
    }
    if arch == "qwen2":  # tied like the small Qwen2.5 models; both query heads share a KV head
        return Qwen2Config(**common, num_key_value_heads=1, tie_word_embeddings=True)
    if arch == "qwen3":  # Qwen3's default head_dim is 128; vLLM's CPU kernels want 64
        return Qwen3Config(**common, num_key_value_heads=1, head_dim=64, tie_word_embeddings=False)
    if arch == "llama":
        return LlamaConfig(**common, num_key_value_heads=2, head_dim=64, tie_word_embeddings=False)
    if arch == "mistral":
        return MistralConfig(
            **common, num_key_value_heads=2, head_dim=64, sliding_window=None,
            tie_word_embeddings=False,
        )
    if arch == "qwen3_moe":  # every layer sparse, Qwen3-30B-A3B's routing (top-k renormalised)
        return Qwen3MoeConfig(
            **common, num_key_value_heads=1, head_dim=64, tie_word_embeddings=False,
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128,
            decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
        )
    if arch == "mixtral":
        return MixtralConfig(
            **{**common, "intermediate_size": 128}, num_key_value_heads=2, head_dim=64,
            sliding_window=None, tie_word_embeddings=False, num_local_experts=4,
            num_experts_per_tok=2,
        )
    raise ValueError(f"arch={arch!r} is not one of {', '.join(CHAT_ARCHS + MOE_ARCHS)}")


def _random_model(config: Any, seed: int) -> Any:
    """Initialised from ``seed`` without disturbing the caller's random state."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config).float().eval()


def _versions() -> dict[str, str]:
    """Initialisation and BPE training may change between releases of these."""
    return {name: metadata.version(name) for name in ("torch", "transformers", "tokenizers")}


def make_chat_model(
    out_dir: str | os.PathLike[str],
    arch: str = "qwen2",
    seed: int = 0,
    corpus: Sequence[str] | None = None,
    vocab_size: int = 400,
    context: int | None = None,
) -> str:
    """A Qwen2/Qwen3/Llama/Mistral checkpoint with a ChatML BPE tokenizer; returns the dir.
    ``qwen3_moe`` and ``mixtral`` (:data:`MOE_ARCHS`) make mixture-of-experts ones, stored
    as their releases are: one matrix per expert.

    Shipped as Qwen2.5 ships: ``<|im_end|>`` is the tokenizer's EOS and ``config.json``'s,
    ``generation_config.json`` lists ``[<|im_end|>, <|endoftext|>]``, ``<|endoftext|>`` pads,
    there is no BOS, and the chat template sits in ``tokenizer_config.json``. qwen2 ties
    its embeddings and qwen2/qwen3 share one KV head between both query heads, so both
    code paths run; llama and mistral are untied with a KV head per query head (their
    parameters have the same names and shapes, so one seed gives both the same numbers).
    ``context``: the context length (default 1024; agent harnesses' prompts take tens of
    thousands of tokens).
    """
    if arch not in CHAT_ARCHS + MOE_ARCHS:
        raise ValueError(f"arch={arch!r} is not one of {', '.join(CHAT_ARCHS + MOE_ARCHS)}")
    lines = list(default_corpus() if corpus is None else corpus)
    fingerprint = {
        "format": _FORMAT,
        "kind": "chat",
        "arch": arch,
        "seed": seed,
        "vocab_size": vocab_size,
        "corpus_sha256": hashlib.sha256(json.dumps(lines).encode()).hexdigest(),
        "versions": _versions(),
        **({"context": context} if context else {}),
    }

    def write(tmp: Path) -> None:
        from transformers import GenerationConfig

        tokenizer = build_chat_tokenizer(lines, vocab_size, context)
        im_end, endoftext = (tokenizer.convert_tokens_to_ids(t) for t in (IM_END, ENDOFTEXT))
        model = _random_model(_chat_config(arch, vocab_size, eos=im_end, pad=endoftext,
                                           context=context), seed)
        model.generation_config = GenerationConfig(
            bos_token_id=None, eos_token_id=[im_end, endoftext], pad_token_id=endoftext
        )
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp, save_jinja_files=False)

    return _build(Path(out_dir), fingerprint, write)


#: real models' shapes (Qwen2.5's published configs), for checks at a real model's size:
#: ``model_vocab`` is the embedding's rows (Qwen pads its 151,665 tokens to 151,936)
REAL_SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                     "num_attention_heads": 14, "num_key_value_heads": 2,
                     "model_vocab": 151936},
    "qwen2.5-1.5b": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                     "num_attention_heads": 12, "num_key_value_heads": 2,
                     "model_vocab": 151936},
    # the smallest shape whose bf16 snapshot passes the data layer's 64 MiB body limit
    # (72 MB): 36M parameters, two layers, head_dim 64 for vLLM's CPU kernels
    "over-64mb": {"hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 2,
                  "num_attention_heads": 8, "num_key_value_heads": 2, "model_vocab": 64000,
                  "tie_word_embeddings": False},
}


def make_sized_chat_model(out_dir: str | os.PathLike[str], shape: str = "qwen2.5-0.5b",
                          seed: int = 0, vocab_size: int = 400) -> str:
    """A Qwen2 checkpoint of a real model's shape (:data:`REAL_SHAPES`), randomly
    initialised and saved in bfloat16 as releases are, with the chat fixtures' ChatML BPE
    tokenizer (``vocab_size`` tokens; the embedding has the shape's ``model_vocab`` rows,
    as Qwen's has more rows than tokens). It measures the machinery at size, not
    learning: a random model writes noise until its length limit."""
    if shape not in REAL_SHAPES:
        raise ValueError(f"shape={shape!r} is not one of {', '.join(REAL_SHAPES)}")
    dims = dict(REAL_SHAPES[shape])
    lines = default_corpus()
    fingerprint = {"format": _FORMAT, "kind": "sized-chat", "shape": dims, "seed": seed,
                   "vocab_size": vocab_size, "versions": _versions()}

    def write(tmp: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, GenerationConfig, Qwen2Config

        tokenizer = build_chat_tokenizer(lines, vocab_size)
        im_end, endoftext = (tokenizer.convert_tokens_to_ids(t) for t in (IM_END, ENDOFTEXT))
        config = Qwen2Config(
            hidden_size=dims["hidden_size"], intermediate_size=dims["intermediate_size"],
            num_hidden_layers=dims["num_hidden_layers"],
            num_attention_heads=dims["num_attention_heads"],
            num_key_value_heads=dims["num_key_value_heads"], vocab_size=dims["model_vocab"],
            max_position_embeddings=32768, rope_theta=1000000.0,
            tie_word_embeddings=dims.get("tie_word_embeddings", True),
            bos_token_id=None, eos_token_id=im_end, pad_token_id=endoftext,
            dtype="bfloat16")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
        model.generation_config = GenerationConfig(
            bos_token_id=None, eos_token_id=[im_end, endoftext], pad_token_id=endoftext)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp, save_jinja_files=False)

    return _build(Path(out_dir), fingerprint, write)


#: the word-level fixture's vocabulary after its specials: whole numbers, operators, words
WORDS = (
    *(str(n) for n in range(100)),
    *"+-*/=()?:,.",
    "yes", "no", "answer", "calc", "what", "is", "the", "correct",
)


def build_wordlevel_tokenizer() -> PreTrainedTokenizerFast:
    """Whitespace-split words with Llama's specials at Llama's ids and a BOS added on encode.

    It declares no pad token, so a loader has to fall back (to EOS) by itself; it has no
    decoder, so decoding joins words with single spaces, as the vocabulary splits them.
    """
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate((UNK, BOS, EOS, *WORDS))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.add_special_tokens(
        [AddedToken(tok, special=True, normalized=False) for tok in (UNK, BOS, EOS)]
    )
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, vocab[BOS])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token=BOS, eos_token=EOS, unk_token=UNK,
        model_max_length=_SHAPE["max_position_embeddings"],
    )


def make_wordlevel_llama(out_dir: str | os.PathLike[str], seed: int = 0) -> str:
    """A Llama checkpoint with a word-level tokenizer and no pad or chat template.

    The opposite of :func:`make_chat_model` in every tokenizer convention: specials at the
    start of the vocabulary, a BOS the tokenizer adds by itself, one EOS, ``pad_token_id``
    unset everywhere, plain-text prompts only.
    """
    fingerprint = {"format": _FORMAT, "kind": "wordlevel-llama", "seed": seed,
                   "words": list(WORDS), "versions": _versions()}

    def write(tmp: Path) -> None:
        from transformers import LlamaConfig

        tokenizer = build_wordlevel_tokenizer()
        config = LlamaConfig(
            **_SHAPE,
            vocab_size=len(tokenizer),
            num_key_value_heads=2,
            head_dim=64,
            tie_word_embeddings=False,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=None,
        )
        _random_model(config, seed).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    return _build(Path(out_dir), fingerprint, write)


def _weight_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / name for name in names]
    single = model_dir / "model.safetensors"
    if not single.is_file():
        raise FileNotFoundError(f"{model_dir} holds no model.safetensors (nor a sharded index)")
    return [single]


def _weights_sha256(model_dir: Path) -> str:
    digest = hashlib.sha256()
    for path in _weight_files(model_dir):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _stamp_matches(out_dir: Path, fingerprint: dict[str, Any]) -> bool:
    try:
        stamp = json.loads((out_dir / _STAMP).read_text())
        return stamp["fingerprint"] == fingerprint and stamp["weights_sha256"] == (
            _weights_sha256(out_dir)
        )
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _build(out: Path, fingerprint: dict[str, Any], write: Callable[[Path], None]) -> str:
    """Reuse ``out`` if its stamp matches, else ``write`` a temporary sibling and rename it.

    Concurrent callers (pytest-xdist workers, several test sessions sharing the cache)
    never see a half-written checkpoint; the first to finish wins and the others keep
    its identical files. A directory holding files but no stamp is someone else's.
    """
    if _stamp_matches(out, fingerprint):
        return str(out)
    if out.exists() and any(out.iterdir()) and not (out / _STAMP).exists():
        raise FileExistsError(f"{out} holds files but no model fixture; refusing to replace them")

    def write_stamped(tmp: Path) -> None:
        write(tmp)
        stamp = {"fingerprint": fingerprint, "weights_sha256": _weights_sha256(tmp)}
        (tmp / _STAMP).write_text(json.dumps(stamp, indent=2))

    build_dir(out, write_stamped, lambda d: _stamp_matches(d, fingerprint))
    return str(out)


def sft_warmstart(
    model_dir: str | os.PathLike[str],
    examples: Sequence[tuple[list[int], list[int]]],
    steps: int,
    lr: float = 3e-4,
    batch: int = 32,
    seed: int = 0,
) -> None:
    """Supervised steps on (prompt ids, target ids) pairs, written back into ``model_dir``.

    RL on a random model learns nothing (no sample is ever rewarded); a few hundred
    steps on the task's format give a weak policy that sometimes answers right, as the
    default run's tiny model does. Training is in float32 whatever the checkpoint's dtype;
    only the safetensors files are rewritten, with their own names, dtypes and metadata,
    so the tokenizer and config files stay byte-identical.
    """
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from astraflow.models.tiny import supervised_steps

    if not examples:
        raise ValueError("sft_warmstart needs at least one (prompt, target) example")
    root = Path(model_dir)
    files = _weight_files(root)
    model = AutoModelForCausalLM.from_pretrained(root, dtype=torch.float32)
    pad = model.config.pad_token_id
    supervised_steps(model, examples, steps=steps, lr=lr, batch=batch,
                     pad_token_id=0 if pad is None else pad, seed=seed)
    state = model.state_dict()
    for path in files:
        with safe_open(str(path), framework="pt") as saved:
            meta = saved.metadata()
            dtypes = {key: saved.get_tensor(key).dtype for key in saved.keys()}  # noqa: SIM118
        missing = sorted(set(dtypes) - set(state))
        if missing:
            raise ValueError(f"{path} holds tensors the loaded model lacks: {missing[:5]}")
        tensors = {key: state[key].detach().to(dtype=dtype, copy=True).contiguous()
                   for key, dtype in dtypes.items()}
        tmp = path.with_name(f".{path.name}.tmp")
        save_file(tensors, str(tmp), metadata=meta)
        os.replace(tmp, path)


__all__ = [
    "CHAT_ARCHS",
    "CHAT_SPECIALS",
    "CHAT_TEMPLATE",
    "build_chat_tokenizer",
    "build_wordlevel_tokenizer",
    "default_corpus",
    "make_chat_model",
    "make_wordlevel_llama",
    "sft_warmstart",
]
