"""Files written without torch are standard safetensors, canonical and checked on read."""

from __future__ import annotations

import numpy as np
import pytest
from weights_helpers import make_model, same

from astraflow.weights import safetensors_io as st
from astraflow.weights.errors import CorruptError


def test_round_trip_and_canonical_bytes(tmp_path):
    model = make_model()
    info = st.save(tmp_path / "a.safetensors", model)
    again = st.save(tmp_path / "b.safetensors", dict(reversed(model.items())))
    assert info == again == st.digest(model)
    loaded, metadata = st.load(tmp_path / "a.safetensors")
    assert metadata == {}
    assert same(loaded, model)


def test_torch_reads_bf16_values(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    values = np.random.default_rng(0).normal(0, 1, (5, 3)).astype(np.float32)
    st.save(tmp_path / "m.safetensors", {"w": st.bf16_from_float32(values),
                                         "h": st.Tensor.from_array(values.astype(np.float16))})
    loaded = load_file(tmp_path / "m.safetensors")
    assert loaded["w"].dtype == torch.bfloat16 and loaded["h"].dtype == torch.float16
    assert torch.equal(loaded["w"], torch.from_numpy(values).to(torch.bfloat16))
    assert st.from_torch(loaded["w"]).data.tolist() == st.bf16_from_float32(values).data.tolist()


def test_truncated_or_garbled_files_are_refused(tmp_path):
    path = tmp_path / "m.safetensors"
    st.save(path, make_model())
    raw = path.read_bytes()
    for broken in (raw[:-1], raw[:5], b"\xff" * 8 + raw[8:], raw[:8] + b"[" + raw[9:]):
        path.write_bytes(broken)
        with pytest.raises(CorruptError):
            st.load(path)
