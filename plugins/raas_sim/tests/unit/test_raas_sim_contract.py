"""raas=sim passes the shared rollout-backend contract (weights change greedy output)."""

import asyncio
import time

from omegaconf import OmegaConf

from astraflow.plugins import get_registry
from astraflow.testing import assert_plugin_installed
from astraflow.testing.rollout import RolloutBackendContract, prompt_ids
from astraflow.types import GenerationRequest


class TestSimRolloutContract(RolloutBackendContract):
    backend_name = "sim"


def test_plugin_is_installed():
    assert_plugin_installed("raas_sim", "astraflow-plugin-raas-sim", "raas", "sim")


def test_latency_is_the_configured_one_and_tokens_come_from_the_vocabulary(tiny_model_dir):
    from astraflow.text import load_tokenizer

    entry = get_registry().get("rollout_backend", "sim")
    cfg = OmegaConf.merge(OmegaConf.structured(entry.config_cls),
                          {"generation_seconds": 0.2, "token_seconds": 0.01,
                           "env_seconds": 0.1})
    backend = entry.create(cfg, tiny_model_dir)
    request = GenerationRequest(prompt_ids(tiny_model_dir, "1+1="), max_new_tokens=10, n=4)

    async def timed():
        await backend.start()
        t0 = time.perf_counter()
        gens = await asyncio.gather(*(backend.generate(request) for _ in range(8)))
        return time.perf_counter() - t0, gens

    elapsed, results = asyncio.run(timed())
    longest = max(len(g.token_ids) for gens in results for g in gens)
    expected = 0.2 + 0.01 * longest + 0.1
    # eight concurrent calls overlap: one call's latency, not eight
    assert expected <= elapsed < expected + 1.0
    vocab = load_tokenizer(tiny_model_dir).vocab_size
    for gens in results:
        assert len(gens) == 4
        for gen in gens:
            assert all(0 <= t < vocab for t in gen.token_ids)
            assert all(lp <= 0 for lp in gen.logprobs)
