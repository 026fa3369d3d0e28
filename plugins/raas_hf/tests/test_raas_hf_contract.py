"""raas=hf passes the shared rollout-backend contract on CPU with a real tiny model."""

from astraflow.testing.rollout import RolloutBackendContract


class TestHFRolloutContract(RolloutBackendContract):
    backend_name = "hf"

    def test_a_swap_lands_between_two_decode_steps(self, engine, tiny_model_dir, tmp_path):
        """The swap waits for no generation: one under way takes the new weights at its
        next step. Its tokens before that are exactly what the old weights sample alone
        (greedy), and are labelled old; the rest are labelled new."""
        from astraflow.testing.rollout import LONG, perturbed_copy

        loop, backend = engine
        old = backend.version
        alone = loop.run(backend.generate(self._req(
            tiny_model_dir, "12+30=", temperature=0.0, max_new_tokens=LONG,
            stop_token_ids=[0])))[0]
        noisy = perturbed_copy(tiny_model_dir, tmp_path / "noisy", scale=0.05)
        gen, order = loop.run(self._swap_during(
            backend, tiny_model_dir, noisy, old + 1, started=lambda: not backend._idle.is_set()))
        versions = gen.versions()
        switch = versions.index(old + 1)
        assert order == ["swap", "generation"]
        assert 0 < switch < LONG and gen.version == old
        assert versions == [old] * switch + [old + 1] * (LONG - switch)
        assert gen.token_ids[:switch] == alone.token_ids[:switch]
        assert gen.logprobs[:switch] == alone.logprobs[:switch]
        assert gen.token_ids != alone.token_ids  # the new weights sampled the rest
