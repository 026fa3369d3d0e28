"""A weights refresh streams the file into the engine's tensors in place: the whole file
is never held next to the model, the bits land exactly, and a file that does not fit
the model changes nothing."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from astraflow.plugins import get_registry
from astraflow.testing.engine import LoopThread


@contextlib.contextmanager
def engine(model_dir: str, dtype: str):
    entry = get_registry().get("rollout_backend", "hf")
    backend = entry.create(entry.config_cls(dtype=dtype), model_dir)
    loop = LoopThread()
    loop.run(backend.start())
    try:
        yield loop, backend
    finally:
        loop.run(backend.shutdown())
        loop.close()


def published(model_dir: str, out: Path, dtype=torch.bfloat16, **changes) -> dict:
    """A weights file as a trainer publishes it (checkpoint names, ``dtype``), every
    tensor shifted so that a load shows; ``changes`` replace (or, None, drop) tensors."""
    gen = torch.Generator().manual_seed(1)
    state = {k: (v.float() + 0.1 * torch.randn(v.shape, generator=gen)).to(dtype)
             for k, v in load_file(f"{model_dir}/model.safetensors").items()}
    for name, tensor in changes.items():
        name = name.replace("__", ".")
        if tensor is None:
            del state[name]
        else:
            state[name] = tensor
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"))
    return state


def snapshot(backend) -> dict:
    return {k: v.clone() for k, v in backend.model.state_dict().items()}


@pytest.mark.parametrize("held", ["float32", "bfloat16"])
def test_a_bf16_file_streams_bit_for_bit(chat_model_dir, tmp_path, monkeypatch, held):
    """Into a float32 and a bfloat16 engine, through chunks smaller than a tensor (odd
    elements spanning two reads): every tensor equals the file's, converted; the tied
    lm_head follows its embedding; no read exceeds the chunk."""
    from astraflow_raas_hf import streaming

    state = published(chat_model_dir, tmp_path / "v1")
    with engine(chat_model_dir, held) as (loop, backend):
        assert backend._tied == {"lm_head.weight"}
        monkeypatch.setattr(streaming, "CHUNK_BYTES", 1000)
        reads = []
        read = streaming._read
        monkeypatch.setattr(streaming, "_read", lambda f, into: (reads.append(len(into)),
                                                                 read(f, into)))
        with monkeypatch.context() as m:
            no_whole_file_loaded(m)
            loop.run(backend.load_weights(str(tmp_path / "v1"), 1))
        assert backend.version == 1 and reads and max(reads) <= 1000
        got = backend.model.state_dict()
        dtype = getattr(torch, held)
        for name, tensor in state.items():
            assert got[name].dtype == dtype
            assert torch.equal(got[name], tensor.to(dtype)), name
        assert torch.equal(got["lm_head.weight"], state["model.embed_tokens.weight"].to(dtype))


def no_whole_file_loaded(m) -> None:
    """Fails any whole-file read of the weights (``m``: a monkeypatch)."""
    import astraflow_raas_hf.backend as hf_backend
    import safetensors.torch

    def refused(*args, **kwargs):
        raise AssertionError("the whole weights file was loaded into memory")

    m.setattr(safetensors.torch, "load_file", refused)
    m.setattr(hf_backend, "load_file", refused)
    m.setattr(torch.nn.Module, "load_state_dict", refused)


@pytest.mark.parametrize("change, message", [
    ({"model__layers__0__mlp__up_proj__weight": torch.zeros(3, 4, dtype=torch.bfloat16)},
     "shapes"),
    ({"model__layers__1__mlp__up_proj__weight": None}, "missing"),
    ({"model__extra__weight": torch.zeros(2, dtype=torch.bfloat16)}, "unexpected"),
])
def test_a_file_that_does_not_fit_changes_nothing(chat_model_dir, tmp_path, change, message):
    """A wrong shape, a missing or an extra tensor is found in the header: ValueError,
    and not one tensor of the engine's changed (the fitting ones come first in the
    file, so a loader that checked as it went would have written them)."""
    published(chat_model_dir, tmp_path / "bad", **change)
    with engine(chat_model_dir, "float32") as (loop, backend):
        before = snapshot(backend)
        with pytest.raises(ValueError, match=message):
            loop.run(backend.load_weights(str(tmp_path / "bad"), 1))
        assert backend.version != 1
        after = backend.model.state_dict()
        assert all(torch.equal(after[k], v) for k, v in before.items())


def test_a_swap_streams_too(chat_model_dir, tmp_path, monkeypatch):
    """Partial rollouts' swap (``_apply_swap``) loads through the same stream."""
    state = published(chat_model_dir, tmp_path / "v2")
    with engine(chat_model_dir, "bfloat16") as (loop, backend):
        no_whole_file_loaded(monkeypatch)
        loop.run(backend.swap_weights(str(tmp_path / "v2"), 2))
        assert backend.version == 2
        got = backend.model.state_dict()
        assert all(torch.equal(got[k], v) for k, v in state.items())


def test_fused_experts_still_load_from_the_whole_file(moe_model_dir, tmp_path):
    """A model held in another layout than its checkpoint (Qwen3-MoE's fused experts)
    converts the file at once, as before, into exactly what the checkpoint says."""
    from astraflow.models import hf_layout

    state = published(moe_model_dir, tmp_path / "v1", dtype=torch.float32)
    with engine(moe_model_dir, "float32") as (loop, backend):
        assert hf_layout.converts(backend.model)
        loop.run(backend.load_weights(str(tmp_path / "v1"), 1))
        want = hf_layout.to_model(backend.model, state)
        got = backend.model.state_dict()
        assert want.keys() <= got.keys()
        assert all(torch.equal(got[k], v) for k, v in want.items())
        bad = dict(state)
        bad.pop(next(iter(bad)))
        save_file(bad, str(tmp_path / "bad.safetensors"))
        before = snapshot(backend)
        with pytest.raises(ValueError, match="missing"):
            loop.run(backend.load_weights(str(tmp_path / "bad.safetensors"), 2))
        assert all(torch.equal(backend.model.state_dict()[k], v) for k, v in before.items())
