"""Llama with grouped KV heads, tied embeddings, Qwen2 (q/k/v biases), Qwen3 (q/k norms)
and Mistral (Llama's decoder under its own model type).

The tiny default model has as many KV heads as query heads, which makes the grouped
q/k/v layout trivial; these random checkpoints do not. The Mistral one is a whole
checkpoint as users bring it (BPE tokenizer, chat template, generation config).
"""

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from astraflow_trainer_megatron import MegatronConfig
from omegaconf import OmegaConf
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

from astraflow.plugins import get_registry
from astraflow.testing.models import make_chat_model
from astraflow.testing.trainer import arithmetic_batch

SHAPE = {
    "vocab_size": 64,
    "hidden_size": 128,
    "intermediate_size": 192,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 64,
}
CONFIGS = {
    "llama-gqa": lambda: LlamaConfig(**SHAPE, tie_word_embeddings=False),
    "llama-tied": lambda: LlamaConfig(**SHAPE, tie_word_embeddings=True),
    "qwen2": lambda: Qwen2Config(**SHAPE, tie_word_embeddings=False),
    "qwen3": lambda: Qwen3Config(**SHAPE, tie_word_embeddings=False),
}
#: whole checkpoints, made in the given directory
CHECKPOINTS = {
    "mistral": lambda path: make_chat_model(path, arch="mistral"),
    # mixture-of-experts layers: a router and one matrix per expert, top-2 of four
    "qwen3_moe": lambda path: make_chat_model(path, arch="qwen3_moe"),
    "mixtral": lambda path: make_chat_model(path, arch="mixtral"),
}


def _megatron(model_dir: Path, **settings: Any) -> Any:
    config = OmegaConf.structured(MegatronConfig(**settings))
    return get_registry().get("trainer_backend", "megatron").create(config, str(model_dir))


@pytest.mark.parametrize("kind", sorted([*CONFIGS, *CHECKPOINTS]))
def test_checkpoint_round_trips_and_computes_the_same_logits(kind: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    if kind in CHECKPOINTS:
        made = CHECKPOINTS[kind](tmp_path)
        hf = AutoModelForCausalLM.from_pretrained(made, dtype=torch.float32).eval()
    else:
        hf = AutoModelForCausalLM.from_config(CONFIGS[kind]()).float().eval()
    with torch.no_grad():  # random biases and norms too, so a misplaced one shows
        for param in hf.parameters():
            param.normal_(0.0, 0.1)
    hf.save_pretrained(tmp_path)
    backend = _megatron(tmp_path, export_dtype="float32")

    exported = backend.export_weights()
    saved = load_file(str(tmp_path / "model.safetensors"))
    assert exported.keys() == saved.keys()  # a tied lm_head is stored once, as saved
    for name, tensor in saved.items():
        assert torch.equal(exported[name], tensor), name

    ids = torch.randint(0, hf.config.vocab_size, (2, 24))
    with torch.no_grad():
        diff = (backend.logits(backend.model, ids) - hf(input_ids=ids).logits).abs().max()
    assert float(diff) < 1e-4


def test_unsupported_checkpoints_and_layouts_are_refused_clearly(
    tmp_path: Path, tiny_model_dir: str
) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match=r"model_type 'gpt2' is not supported.*llama, qwen2"):
        _megatron(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mistral",
                                                      "sliding_window": 4096}))
    with pytest.raises(ValueError, match=r"sliding_window=4096 is not supported \(only None\)"):
        _megatron(tmp_path)
    with pytest.raises(ValueError, match="torchrun --nproc-per-node 2"):
        _megatron(Path(tiny_model_dir), tensor_model_parallel_size=2, world_size=2)
    with pytest.raises(ValueError, match="pipeline_model_parallel_size=2 needs one process"):
        _megatron(Path(tiny_model_dir), pipeline_model_parallel_size=2, world_size=2)
    with pytest.raises(ValueError, match="2 layers: not divisible into"):
        _megatron(Path(tiny_model_dir), pipeline_model_parallel_size=3, world_size=3)


def test_moe_layouts_megatron_cannot_run_are_refused_clearly(tmp_path: Path,
                                                             tiny_model_dir: str) -> None:
    moe = make_chat_model(tmp_path / "moe", arch="qwen3_moe")
    with pytest.raises(ValueError) as info:
        _megatron(Path(moe), tensor_model_parallel_size=2, world_size=2)
    assert str(info.value) == (
        f"trainer.tensor_model_parallel_size=2 with the mixture-of-experts model {moe}: "
        "Megatron splits experts over tensor-parallel ranks only with sequence parallelism, "
        "which trainer=megatron does not run; split them with expert_model_parallel_size")
    with pytest.raises(ValueError, match=r"expert_model_parallel_size=3 does not divide "
                                         r"the 3 data-parallel replicas|does not divide the 4 "
                                         r"experts"):
        _megatron(Path(moe), expert_model_parallel_size=3, world_size=3)
    with pytest.raises(ValueError, match=r"expert_model_parallel_size=2 does not divide the 1 "
                                         r"data-parallel"):
        _megatron(Path(moe), expert_model_parallel_size=2)
    with pytest.raises(ValueError, match=r"expert_model_parallel_size=2: .* is a dense model"):
        _megatron(Path(tiny_model_dir), expert_model_parallel_size=2, world_size=2)
    config = json.loads((Path(moe) / "config.json").read_text())
    (Path(moe) / "config.json").write_text(json.dumps({**config, "mlp_only_layers": [1]}))
    with pytest.raises(ValueError, match=r"mlp_only_layers=\[1\] is not supported \(only \[\]\)"):
        _megatron(Path(moe))


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU mode exists only without CUDA")
def test_cpu_mode_leaves_torch_cuda_untouched(tiny_model_dir: str) -> None:
    """Other code in the process still learns that there is no CUDA device."""
    real = torch.cuda.current_device
    backend = _megatron(Path(tiny_model_dir))
    batch = arithmetic_batch(tiny_model_dir, [1.0, -1.0])
    backend.train_step(batch)
    assert torch.cuda.current_device is real
    with pytest.raises((RuntimeError, AssertionError)):
        torch.cuda.current_device()
