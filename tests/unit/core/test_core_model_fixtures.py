"""The locally made checkpoints load as real ones do and tokenize the same everywhere.

Tests that train "any Hugging Face checkpoint" are only as good as these fixtures: each
must load through ``transformers`` like a downloaded model, agree with its own
``tokenizer.json`` on every id, declare its stop tokens the way Qwen ships them, and come
out byte-identical from the same arguments.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from astraflow.testing.models import (
    CHAT_ARCHS,
    make_chat_model,
    make_wordlevel_llama,
    sft_warmstart,
)

TEXTS = (
    "12+7=19",
    "What is 3-15? answer: -12",
    "héllo wörld, 你好 12 + 7 = ✓ 🙂",
    "tabs\tand\r\nnewlines\n\n  and   spaces ",
    "Ωmega ∑ ℵ0 ünïcödé ß ﬁ \u200b zero-width",
    "",
)
CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "12+7="}]
RENDERED = (
    "<|im_start|>system\nBe brief.<|im_end|>\n"
    "<|im_start|>user\n12+7=<|im_end|>\n"
    "<|im_start|>assistant\n"
)
#: the ChatML specials follow the 397 trained tokens of the default vocab_size=400
ENDOFTEXT, IM_START, IM_END = 397, 398, 399


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fixtures")
    out = {arch: Path(make_chat_model(root / arch, arch=arch)) for arch in CHAT_ARCHS}
    out["wordlevel"] = Path(make_wordlevel_llama(root / "wordlevel"))
    return out


@pytest.mark.parametrize("arch", CHAT_ARCHS)
def test_each_arch_loads_in_transformers_and_computes_finite_logits(arch, made):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(made[arch]).eval()
    tokenizer = AutoTokenizer.from_pretrained(made[arch])
    cfg = model.config
    assert cfg.model_type == arch and model.dtype == torch.float32
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_hidden_layers) == (128, 2, 2)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    assert head_dim == 64  # vLLM's CPU attention kernels reject smaller heads
    assert cfg.num_key_value_heads == (1 if arch.startswith("qwen") else 2)
    assert cfg.tie_word_embeddings == (arch == "qwen2")
    if arch == "mistral":
        assert cfg.sliding_window is None
    assert len(tokenizer) == cfg.vocab_size == 400
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.bos_token) == (
        IM_END, ENDOFTEXT, None)
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") == IM_START
    ids = tokenizer.apply_chat_template(CONVERSATION, add_generation_prompt=True, tokenize=True,
                                        return_dict=False)
    assert ids[0] == IM_START and ids[-1] != IM_END
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([list(ids)])).logits
    assert logits.shape == (1, len(ids), 400)
    assert bool(torch.isfinite(logits).all())


@pytest.mark.parametrize("arch", CHAT_ARCHS)
def test_transformers_and_tokenizer_json_agree_and_round_trip(arch, made):
    """transformers rebuilds a qwen2 tokenizer with Qwen's own split; the ids must not move."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    theirs = AutoTokenizer.from_pretrained(made[arch])
    ours = Tokenizer.from_file(str(made[arch] / "tokenizer.json"))
    for text in (*TEXTS, RENDERED):
        ids = ours.encode(text, add_special_tokens=True).ids
        assert theirs(text)["input_ids"] == ids, text
        assert ours.decode(ids, skip_special_tokens=False) == text
    assert ours.encode(RENDERED).ids.count(IM_END) == 2  # specials are never split
    assert ours.encode("12").ids == [ours.token_to_id("1"), ours.token_to_id("2")]


def test_the_chat_template_renders_chatml_with_the_generation_prompt(made):
    from transformers import AutoTokenizer

    from astraflow.text import load_tokenizer

    tokenizer = AutoTokenizer.from_pretrained(made["qwen2"])
    assert tokenizer.apply_chat_template(
        CONVERSATION, add_generation_prompt=True, tokenize=False) == RENDERED
    assert tokenizer.apply_chat_template(CONVERSATION[1:], tokenize=False) == (
        "<|im_start|>user\n12+7=<|im_end|>\n")  # no default system turn
    config = json.loads((made["qwen2"] / "tokenizer_config.json").read_text())
    assert "{%- if tools %}" in config["chat_template"]  # kept where Qwen2.5 keeps it
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {
        "type": "object", "properties": {"expression": {"type": "string"}}}}}]
    conversation = [*CONVERSATION, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "calc", "arguments": {"expression": "12+7"}}}]},
        {"role": "tool", "content": "19"}]
    rendered = tokenizer.apply_chat_template(conversation, tools=tools,
                                             add_generation_prompt=True, tokenize=False)
    assert rendered.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert ('<tool_call>\n{"name": "calc", "arguments": {"expression": "12+7"}}\n</tool_call>'
            '<|im_end|>\n<|im_start|>user\n<tool_response>\n19\n</tool_response><|im_end|>\n'
            '<|im_start|>assistant\n') in rendered
    assert load_tokenizer(made["qwen2"]).render_chat(conversation, tools=tools) == rendered


def test_stop_and_pad_ids_are_declared_as_qwen_ships_them(made):
    from astraflow.text import load_tokenizer

    for arch in CHAT_ARCHS:
        root = made[arch]
        generation = json.loads((root / "generation_config.json").read_text())
        config = json.loads((root / "config.json").read_text())
        tok_cfg = json.loads((root / "tokenizer_config.json").read_text())
        assert generation["eos_token_id"] == [IM_END, ENDOFTEXT]
        assert generation["pad_token_id"] == config["pad_token_id"] == ENDOFTEXT
        assert config["eos_token_id"] == IM_END and config.get("bos_token_id") is None
        assert (tok_cfg["eos_token"], tok_cfg["pad_token"]) == ("<|im_end|>", "<|endoftext|>")
        assert tok_cfg.get("bos_token") is None
        tokenizer = load_tokenizer(root)
        assert tokenizer.stop_token_ids == [IM_END, ENDOFTEXT]
        assert (tokenizer.pad_token_id, tokenizer.bos_token_id) == (ENDOFTEXT, None)


def test_the_wordlevel_llama_has_foreign_specials_a_bos_and_no_pad(made):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = made["wordlevel"]
    tokenizer = AutoTokenizer.from_pretrained(root)
    model = AutoModelForCausalLM.from_pretrained(root).eval()
    assert (tokenizer.unk_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    assert tokenizer.pad_token is None and tokenizer.chat_template is None
    assert (model.config.bos_token_id, model.config.eos_token_id) == (1, 2)
    assert model.config.pad_token_id is None
    ids = tokenizer("1 + 2 = 3")["input_ids"]
    assert ids[0] == 1 and len(ids) == 6
    assert tokenizer.decode(ids, skip_special_tokens=True) == "1 + 2 = 3"
    assert tokenizer("12+7= banana")["input_ids"] == [1, 0, 0]  # unknown words are <unk>
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits
    assert logits.shape == (1, 6, len(tokenizer)) and bool(torch.isfinite(logits).all())


def test_the_same_arguments_give_the_same_files_and_a_match_is_reused(tmp_path, made):
    for arch in ("qwen2", "mistral"):
        again = Path(make_chat_model(tmp_path / arch, arch=arch))
        for name in ("model.safetensors", "tokenizer.json", "config.json"):
            assert sha256(again / name) == sha256(made[arch] / name), (arch, name)
    other_seed = Path(make_chat_model(tmp_path / "seed1", arch="qwen2", seed=1))
    assert sha256(other_seed / "model.safetensors") != sha256(made["qwen2"] / "model.safetensors")
    assert sha256(Path(make_wordlevel_llama(tmp_path / "wl")) / "model.safetensors") == sha256(
        made["wordlevel"] / "model.safetensors")

    weights = tmp_path / "qwen2" / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    make_chat_model(tmp_path / "qwen2", arch="qwen2")
    assert weights.stat().st_mtime_ns == mtime  # reused, not rewritten


def test_refusals(tmp_path):
    with pytest.raises(ValueError, match="arch='gpt2' is not one of qwen2, qwen3"):
        make_chat_model(tmp_path / "a", arch="gpt2")
    with pytest.raises(ValueError, match=r"the corpus yields .* fewer than vocab_size=5000"):
        make_chat_model(tmp_path / "b", vocab_size=5000)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="holds files but no model fixture"):
        make_chat_model(tmp_path / "c")


def test_sft_warmstart_trains_the_targets_and_rewrites_only_the_weights(tmp_path):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from astraflow.rl.losses import token_logprobs

    root = Path(make_chat_model(tmp_path / "m", arch="qwen2"))
    before = {p.name: p.read_bytes() for p in root.iterdir()}
    examples = [([IM_START, 16, 10, 17, 28], [19, IM_END]), ([IM_START, 18, 28], [18, IM_END])]

    def target_logp() -> float:
        model = AutoModelForCausalLM.from_pretrained(root).eval()
        ids = torch.tensor([examples[0][0] + examples[0][1]])
        with torch.no_grad():
            return float(token_logprobs(model(input_ids=ids).logits, ids)[0, -2:].sum())

    start = target_logp()
    sft_warmstart(root, examples, steps=15, lr=3e-3, batch=4)
    assert target_logp() > start + 1.0
    after = {p.name: p.read_bytes() for p in root.iterdir()}
    assert after.keys() == before.keys()
    changed = {name for name in before if before[name] != after[name]}
    assert changed == {"model.safetensors"}
    saved = load_file(str(root / "model.safetensors"))
    assert "lm_head.weight" not in saved  # still tied
    assert {t.dtype for t in saved.values()} == {torch.float32}
    # the stamp no longer matches the weights: the same arguments rebuild the untrained model
    rebuilt = Path(make_chat_model(root, arch="qwen2"))
    assert (rebuilt / "model.safetensors").read_bytes() == before["model.safetensors"]
