"""raas=vllm with a real engine on CPU: its behaviour log-probs match the HF trainer's,
for the base model and for LoRA adapters, and an adapter's new version loads under the
requests of the old one.

A vLLM engine on CPU takes tens of seconds to start: the tests of this file share one,
serving adapters, in the order written (the first samples the base model before any
adapter is loaded). A run on vLLM is tested with a chat checkpoint in
test_e2e_own_model.py, with LoRA adapters in test_e2e_lora.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from astraflow.plugins import get_registry
from astraflow.testing.engine import LoopThread
from astraflow.testing.rollout import logprob_gaps, make_adapter
from astraflow.types import GenerationRequest

pytest.importorskip("vllm")
pytest.importorskip("peft")

# Both sides compute in float32; vLLM's CPU attention and fused kernels sum in another
# order than the trainer's eager forward, which moves log-probs by ~1e-5.
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def started(tiny_model_dir):
    """A vLLM engine over the tiny model serving rank-16 adapters ``policy`` and
    ``swap``, and the loop it runs on."""
    entry = get_registry().get("rollout_backend", "vllm")
    engine = entry.create(OmegaConf.structured(entry.config_cls), tiny_model_dir)
    engine.configure_adapters(16, ["policy", "swap"])
    loop = LoopThread()
    loop.run(engine.start())
    yield engine, loop
    loop.run(engine.shutdown())
    loop.close()


@pytest.mark.slow
def test_raas_vllm_logprobs_match_trainer_hf_for_the_base_and_an_adapter(started,
                                                                         tiny_model_dir,
                                                                         tmp_path):
    """The engine serves the base model, then a LoRA adapter (through a LoRARequest:
    vLLM's CPU LoRA kernels) and the base beside it, as a node serving two policies as
    adapters does before the second one's first adapter arrives; the HF trainer
    recomputes the base's log-probs, and a LoRA trainer holding the same adapter the
    adapter's. The adapter covers the output layer too, as in +experiment=lora (an
    unadapted request once took the adapter's output layer there)."""
    adapter = make_adapter(tiny_model_dir, tmp_path / "adapter", target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"])
    gaps = logprob_gaps("vllm", "hf", tiny_model_dir, adapter=adapter, with_base=True,
                        started=started)
    for served, (worst, count) in gaps.items():
        print(f"{served}: max |vllm behaviour - hf recomputed| log-prob over {count} "
              f"tokens: {worst:.2e}")
    assert set(gaps) == {"base", "adapter", "base beside the adapter"}
    for worst, count in gaps.values():
        assert count >= 12
        assert worst < TOLERANCE


@pytest.mark.slow
def test_an_adapter_replaced_under_its_requests_serves_them_to_the_end(started,
                                                                       tiny_model_dir,
                                                                       tmp_path):
    """A new version of a policy's adapter loads while requests on the old one are in
    flight or queued: they finish on the old one, the engine lives on, and the old one's
    files go with the last of them. (Removing the old adapter at once left queued
    requests to load it from a deleted directory, which killed vLLM's engine and every
    later request of the node.)"""
    engine, loop = started
    first = make_adapter(tiny_model_dir, tmp_path / "v1", seed=1)
    second = make_adapter(tiny_model_dir, tmp_path / "v2", seed=2)
    loop.run(engine.load_adapter("swap", str(first), 1))
    old_dir = Path(engine._loaded["swap"].lora_path)

    async def swap_under_requests() -> list:
        # more requests than the engine schedules at once: some wait in its queue
        requests = [asyncio.create_task(engine.generate(GenerationRequest(
            [4, 5, 13, 10 + i % 7], max_new_tokens=48, n=4, adapter="swap",
            stop_token_ids=[])))
            for i in range(64)]
        await asyncio.sleep(0)  # every request handed to the engine
        await engine.load_adapter("swap", str(second), 2)
        assert old_dir.exists()  # its requests still need it
        return await asyncio.gather(*requests)

    done = loop.run(swap_under_requests(), timeout=300)
    assert len(done) == 64 and all(len(gens) == 4 for gens in done)
    assert {g.version for gens in done for g in gens} == {1}
    assert not old_dir.exists()  # removed with its last request
    # the engine lives on, serving the new version
    (after,) = loop.run(engine.generate(GenerationRequest(
        [4, 5, 13], max_new_tokens=4, n=1, adapter="swap", stop_token_ids=[])))
    assert after.version == 2
