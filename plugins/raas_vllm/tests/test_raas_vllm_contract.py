"""raas=vllm passes the shared rollout-backend contract on CPU with a real engine.

The engine starts once for the class (tens of seconds on CPU), so the vLLM-specific
checks live in the same class and reuse it.
"""

from __future__ import annotations

import os

import pytest

from astraflow.testing.rollout import RolloutBackendContract, perturbed_copy

pytest.importorskip("vllm")


class TestVLLMRolloutContract(RolloutBackendContract):
    backend_name = "vllm"

    def test_bf16_weights_load_into_a_float32_engine(self, engine, tiny_model_dir, tmp_path):
        """Trainers may publish bf16 while config.json says float32: the engine casts."""
        import torch
        from safetensors.torch import load_file, save_file

        loop, backend = engine
        req = self._req(tiny_model_dir, "9+9=", temperature=0.0, max_new_tokens=6)
        before = loop.run(backend.generate(req))[0]
        state = load_file(os.path.join(tiny_model_dir, "model.safetensors"))
        (tmp_path / "bf16").mkdir()
        save_file({k: v.to(torch.bfloat16) for k, v in state.items()},
                  str(tmp_path / "bf16" / "model.safetensors"))
        try:
            loop.run(backend.load_weights(str(tmp_path / "bf16"), backend.version + 1))
            after = loop.run(backend.generate(req))[0]
        finally:
            loop.run(backend.load_weights(tiny_model_dir, backend.version + 1))
        assert after.version == before.version + 1
        # bf16 keeps 8 mantissa bits: the same greedy tokens, log-probs a little apart
        assert after.token_ids == before.token_ids
        assert after.logprobs == pytest.approx(before.logprobs, abs=0.05)

    def test_weights_that_do_not_fit_are_refused_and_the_engine_keeps_serving(
            self, engine, tiny_model_dir, tmp_path):
        from safetensors.torch import load_file, save_file

        loop, backend = engine
        state = load_file(str(perturbed_copy(tiny_model_dir, tmp_path / "w") /
                              "model.safetensors"))
        state.pop("lm_head.weight")
        save_file(state, str(tmp_path / "w" / "model.safetensors"))
        version = backend.version
        with pytest.raises(ValueError, match=r"missing \['lm_head.weight'\]"):
            loop.run(backend.load_weights(str(tmp_path / "w"), version + 1))
        assert backend.version == version
        gens = loop.run(backend.generate(self._req(tiny_model_dir, n=2)))
        assert [g.version for g in gens] == [version, version]

    def test_greedy_with_n_returns_n_identical_samples(self, engine, tiny_model_dir):
        loop, backend = engine
        gens = loop.run(backend.generate(self._req(tiny_model_dir, temperature=0.0, n=3)))
        assert len(gens) == 3 and gens[0] == gens[1] == gens[2]
