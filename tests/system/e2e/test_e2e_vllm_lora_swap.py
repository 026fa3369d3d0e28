"""A new version of a policy's LoRA adapter loads while requests on the old one are in
flight or queued: they finish on the old one, the engine lives on, and the old one's
files go with the last of them. (Removing the old adapter at once left queued requests
to load it from a deleted directory, which killed vLLM's engine and every later request
of the node.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from astraflow.plugins import get_registry
from astraflow.testing.engine import LoopThread
from astraflow.testing.rollout import make_adapter
from astraflow.types import GenerationRequest


@pytest.mark.slow
def test_an_adapter_replaced_under_its_requests_serves_them_to_the_end(tiny_model_dir,
                                                                       tmp_path):
    pytest.importorskip("vllm")
    pytest.importorskip("peft")
    first = make_adapter(tiny_model_dir, tmp_path / "v1", seed=1)
    second = make_adapter(tiny_model_dir, tmp_path / "v2", seed=2)
    entry = get_registry().get("rollout_backend", "vllm")
    engine = entry.create(OmegaConf.structured(entry.config_cls), tiny_model_dir)
    engine.configure_adapters(16, ["policy"])
    loop = LoopThread()
    loop.run(engine.start())
    try:
        loop.run(engine.load_adapter("policy", str(first), 1))
        (old_dir,) = [Path(r.lora_path) for r in engine._loaded.values()]

        async def swap_under_requests() -> list:
            # more requests than the engine schedules at once: some wait in its queue
            requests = [asyncio.create_task(engine.generate(GenerationRequest(
                [4, 5, 13, 10 + i % 7], max_new_tokens=48, n=4, adapter="policy",
                stop_token_ids=[])))
                for i in range(64)]
            await asyncio.sleep(0)  # every request handed to the engine
            await engine.load_adapter("policy", str(second), 2)
            assert old_dir.exists()  # its requests still need it
            return await asyncio.gather(*requests)

        done = loop.run(swap_under_requests(), timeout=300)
        assert len(done) == 64 and all(len(gens) == 4 for gens in done)
        assert {g.version for gens in done for g in gens} == {1}
        assert not old_dir.exists()  # removed with its last request
        # the engine lives on, serving the new version
        (after,) = loop.run(engine.generate(GenerationRequest(
            [4, 5, 13], max_new_tokens=4, n=1, adapter="policy", stop_token_ids=[])))
        assert after.version == 2
    finally:
        loop.run(engine.shutdown())
        loop.close()
