"""raas=vllm passes the shared rollout-backend contract on CPU with a real engine.

The engine starts once for the class (tens of seconds on CPU), so the vLLM-specific
checks live in the same class and reuse it.
"""

from __future__ import annotations

import asyncio
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

    def test_engine_threads_may_run_on_every_core(self, engine):
        """vLLM's own default pins every engine on a host to the same first core: a node
        and an evaluator side by side would share it while the other cores idle. With
        nothing pinned the model runs in the engine-core process: no third process
        polling for work (``executor``)."""
        import psutil

        allowed = os.sched_getaffinity(0)
        _loop, backend = engine
        names = [p.name() for p in backend._processes]
        assert any("EngineCore" in n for n in names), names
        assert not any("Worker" in n for n in names), names
        cores = [p for p in psutil.Process().children(recursive=True)
                 if "EngineCore" in p.name()]
        assert cores
        for core in cores:
            assert set(core.cpu_affinity()) == allowed

    def test_greedy_with_n_returns_n_identical_samples(self, engine, tiny_model_dir):
        loop, backend = engine
        gens = loop.run(backend.generate(self._req(tiny_model_dir, temperature=0.0, n=3)))
        assert len(gens) == 3 and gens[0] == gens[1] == gens[2]

    def test_a_swap_lands_under_a_running_request(self, engine, tiny_model_dir, tmp_path):
        """Partial rollouts on vLLM: a request that has generated tokens is frozen, the
        weights reloaded, and it goes on with them. Its tokens before the swap are exactly
        what the old weights sample alone (greedy) and are labelled old; the rest new."""
        import uuid

        from vllm.inputs import tokens_input
        from vllm.sampling_params import RequestOutputKind

        from astraflow.testing.rollout import LONG

        loop, backend = engine
        old = backend.version
        req = self._req(tiny_model_dir, "12+30=", temperature=0.0, max_new_tokens=LONG,
                        stop_token_ids=[0])  # padding: never sampled, the whole length runs
        alone = loop.run(backend.generate(req))[0]
        noisy = perturbed_copy(tiny_model_dir, tmp_path / "noisy", scale=0.05)
        params = backend.sampling_params(req)
        params.output_kind = RequestOutputKind.CUMULATIVE

        async def scenario():
            swap = None
            stream = backend.engine.generate(tokens_input(list(req.prompt_ids)), params,
                                             request_id=uuid.uuid4().hex)
            async for out in stream:  # a cumulative output per engine step
                if swap is None and len(out.outputs[0].token_ids) >= 8:
                    swap = asyncio.ensure_future(backend.swap_weights(str(noisy), old + 1))
                last = out
            await swap
            await backend.swap_weights(tiny_model_dir, old + 2)
            return backend._generation(last.outputs[0])

        gen = loop.run(scenario())
        versions = gen.versions()
        switch = versions.index(old + 1)
        assert len(gen.token_ids) == LONG and 8 <= switch < LONG and gen.version == old
        assert versions == [old] * switch + [old + 1] * (LONG - switch)
        assert gen.token_ids[:switch] == alone.token_ids[:switch]
        assert gen.logprobs[:switch] == pytest.approx(alone.logprobs[:switch], abs=1e-4)
        assert gen.token_ids != alone.token_ids  # the new weights sampled the rest


@pytest.mark.parametrize("executor", ["mp", "auto"])
def test_shutdown_returns_and_ends_the_workers_when_the_engine_core_died(executor,
                                                                        tiny_model_dir):
    """The engine core killed (as by the OOM killer) while its worker is stuck (as in a
    long kernel compile) orphans the worker, which holds the resource tracker's pipe: a
    node or evaluator shutting down must not wait on it forever, and must leave no
    engine process behind. (``executor=mp``, what pinned cores get, has a worker process
    of its own; with ``auto`` on CPU the killed core was running the model itself.)"""
    import signal
    import threading

    import psutil
    from omegaconf import OmegaConf

    from astraflow.plugins import get_registry
    from astraflow.testing import wait_until
    from astraflow.testing.engine import LoopThread

    entry = get_registry().get("rollout_backend", "vllm")
    config = OmegaConf.structured(entry.config_cls)
    config.executor = executor
    backend = entry.create(config, tiny_model_dir)
    loop = LoopThread()
    # what earlier tests of this process left running (a multiprocessing resource
    # tracker lives as long as the process) is not the engine's
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    loop.run(backend.start())
    engine_processes = [p for p in psutil.Process().children(recursive=True)
                        if p.pid not in before]
    names = {p.pid: p.name() for p in engine_processes}
    [core] = [p for p in engine_processes if "EngineCore" in names[p.pid]]
    workers = [p for p in engine_processes if "Worker" in names[p.pid]]
    assert len(workers) == (executor == "mp"), names
    for worker in workers:
        worker.send_signal(signal.SIGSTOP)  # stuck: it cannot notice that its core died
    core.send_signal(signal.SIGKILL)
    wait_until(lambda: not core.is_running() or core.status() == psutil.STATUS_ZOMBIE, 30,
               "the engine core to die")
    done = threading.Event()
    threading.Thread(target=lambda: (loop.run(backend.shutdown()), done.set()),
                     daemon=True).start()
    wait_until(done.is_set, 120, "shutdown to return after the engine core died")
    loop.close()
    assert not [p for p in engine_processes
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.parametrize(("executor", "bind", "own_process"), [
    ("auto", "nobind", False), ("auto", "auto", True), ("auto", "0-1", True),
    ("mp", "nobind", True)])
def test_the_model_runs_in_the_engine_core_unless_cores_are_pinned(
        executor, bind, own_process, tiny_model_dir):
    """Pinning is done in vLLM's worker process, so pinned cores (or ``executor=mp``)
    keep it; otherwise the engine core runs the model itself (no engine started here)."""
    from omegaconf import OmegaConf
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    from astraflow.plugins import get_registry

    entry = get_registry().get("rollout_backend", "vllm")
    config = OmegaConf.structured(entry.config_cls)
    config.executor, config.cpu_threads_bind = executor, bind
    chosen = entry.create(config, tiny_model_dir)._executor()
    assert chosen == ({} if own_process else
                      {"distributed_executor_backend": UniProcExecutor})
