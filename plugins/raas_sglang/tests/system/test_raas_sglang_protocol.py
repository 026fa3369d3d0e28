"""PROTOCOL TESTS: raas=sglang against a stand-in of SGLang's HTTP server, on CPU.

SGLang does not install on CPU machines, so the backend starts and supervises
``tests/system/sglang_protocol_standin.py`` (SGLang's flags, routes and field names, a real
tiny torch model) the way it starts ``sglang.launch_server`` on a GPU machine. The
shared rollout contract runs first on that server, then the protocol specifics:
log-prob triples, ``n > 1``, the weight-refresh call sequence, bad answers, crashes.
The same contract against real SGLang lives in ``tests/system/gpu/``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from astraflow_raas_sglang import SGLangConfig
from astraflow_raas_sglang.engine import SGLangRolloutBackend
from astraflow_raas_sglang.errors import SGLangServerError
from omegaconf import OmegaConf

from astraflow.testing.engine import LoopThread
from astraflow.testing.rollout import RolloutBackendContract, _children, perturbed_copy

HERE = Path(__file__).parent
STANDIN = "sglang_protocol_standin"


def standin_config(log_dir: Path, **kw) -> SGLangConfig:
    kw.setdefault("server_module", STANDIN)
    return OmegaConf.structured(SGLangConfig(log_dir=str(log_dir), health_interval=0.2,
                                             startup_timeout=120, **kw))


@pytest.fixture(scope="class")
def standin_on_path():
    """The stand-in is started as ``python -m sglang_protocol_standin``, like SGLang."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(HERE),
                                                              os.environ.get("PYTHONPATH")])))
        yield


def _reload(backend, path, version):
    async def go():
        await backend.pause()
        try:
            await backend.load_weights(str(path), version)
        finally:
            await backend.resume()

    return go()


@pytest.mark.usefixtures("standin_on_path")
class TestProtocolAgainstStandin(RolloutBackendContract):
    backend_name = "sglang"

    @pytest.fixture(scope="class")
    @classmethod
    def engine(cls, standin_on_path, tiny_model_dir, tmp_path_factory):
        children_before = _children()
        config = standin_config(tmp_path_factory.mktemp("sglang-logs"))
        backend = SGLangRolloutBackend(config, tiny_model_dir)
        loop = LoopThread()
        loop.run(backend.start())
        yield loop, backend
        loop.run(backend.shutdown())
        loop.close()
        assert _children() <= children_before, "the server outlived shutdown()"

    def _gen(self, engine, model_dir, text="12+7=", **kw):
        loop, backend = engine
        return loop.run(backend.generate(self._req(model_dir, text, **kw)))

    def test_logprobs_are_the_models_own_for_each_sampled_token(self, engine, tiny_model_dir):
        import torch
        from transformers import AutoModelForCausalLM

        gens = self._gen(engine, tiny_model_dir, n=3, max_new_tokens=8)
        assert len(gens) == 3  # n > 1 arrives as SGLang's list of n answers
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        prompt = self._req(tiny_model_dir).prompt_ids
        for gen in gens:
            ids = torch.tensor([prompt + gen.token_ids])
            with torch.inference_mode():
                logprobs = torch.log_softmax(model(ids).logits[0, len(prompt) - 1 : -1], -1)
            expected = logprobs.gather(1, torch.tensor(gen.token_ids)[:, None]).squeeze(1)
            assert gen.logprobs == pytest.approx(expected.tolist(), abs=1e-4)

    def test_a_seeded_request_is_reproducible(self, engine, tiny_model_dir):
        a = self._gen(engine, tiny_model_dir, n=4, max_new_tokens=10, seed=7)
        b = self._gen(engine, tiny_model_dir, n=4, max_new_tokens=10, seed=7)
        assert [g.token_ids for g in a] == [g.token_ids for g in b]

    def test_weight_refresh_pauses_updates_with_version_and_continues(
            self, engine, tiny_model_dir, tmp_path):
        loop, backend = engine
        noisy = perturbed_copy(tiny_model_dir, tmp_path / "noisy")
        version = backend.version + 1
        try:
            loop.run(_reload(backend, noisy, version))
            gen = self._gen(engine, tiny_model_dir, temperature=0.0)[0]
            assert gen.version == version  # the server's meta_info.weight_version
            calls = httpx.get(f"{backend.url}/standin/calls").json()[-3:]
            assert [c["route"] for c in calls] == [
                "/pause_generation", "/update_weights_from_disk", "/continue_generation"]
            assert calls[0]["body"] == {"mode": "retract"}
            update = calls[1]
            assert update["paused"]
            assert update["body"]["model_path"] == str(noisy.resolve())
            assert update["body"]["weight_version"] == str(version)
        finally:
            loop.run(_reload(backend, tiny_model_dir, version + 1))

    def test_refused_weights_raise_and_keep_the_version(self, engine, tmp_path):
        import torch
        from safetensors.torch import save_file

        loop, backend = engine
        bad = tmp_path / "bad"
        bad.mkdir()
        save_file({"not.a.weight": torch.zeros(3)}, str(bad / "model.safetensors"))
        before = backend.version
        with pytest.raises(SGLangServerError, match="Failed to update weights"):
            loop.run(_reload(backend, bad, before + 1))
        assert backend.version == before

    def test_invalid_sampling_values_are_reported(self, engine, tiny_model_dir):
        with pytest.raises(SGLangServerError, match=r"HTTP 400.*top_p must be in"):
            self._gen(engine, tiny_model_dir, top_p=0.0)

    @pytest.mark.parametrize(("fault", "message"), [
        ("not_json", "not JSON"),
        ("http_500", "HTTP 500"),
        ("no_meta_info", "no meta_info"),
        ("logprob_count", "output_ids but"),
        ("token_mismatch", "is for token"),
        ("short_batch", "returned 2 samples, asked for 3"),
    ])
    def test_bad_answers_are_clear_errors(self, engine, tiny_model_dir, fault, message):
        _, backend = engine
        httpx.post(f"{backend.url}/standin/fault", json={"kind": fault}).raise_for_status()
        with pytest.raises(SGLangServerError, match=message):
            self._gen(engine, tiny_model_dir, n=3)
        assert len(self._gen(engine, tiny_model_dir, n=3)) == 3  # the next request is fine

    def test_pause_lets_in_flight_requests_finish(self, engine, tiny_model_dir, tmp_path):
        """Even with pause_mode=abort, a request already sent completes in full."""
        loop, managed = engine
        attached = SGLangRolloutBackend(
            standin_config(tmp_path, url=managed.url, pause_mode="abort"), tiny_model_dir)

        async def scenario():
            await attached.start()
            task = asyncio.ensure_future(attached.generate(self._req(
                tiny_model_dir, temperature=1.0, max_new_tokens=150)))
            while attached._inflight == 0:
                await asyncio.sleep(0.005)
            await attached.pause()
            finished_before_pause = task.done()
            await attached.resume()
            gens = await task
            await attached.shutdown()
            return finished_before_pause, gens[0]

        finished, gen = loop.run(scenario())
        assert finished, "pause() returned before the in-flight request finished"
        assert gen.finish_reason == "length" and len(gen.token_ids) == 150

    def test_a_crash_mid_request_restarts_the_server_with_its_weights(
            self, engine, tiny_model_dir, tmp_path):
        loop, backend = engine
        noisy = perturbed_copy(tiny_model_dir, tmp_path / "noisy", scale=0.3)
        version = backend.version + 1
        loop.run(_reload(backend, noisy, version))
        try:
            before = self._gen(engine, tiny_model_dir, temperature=0.0, max_new_tokens=8)[0]
            old_pid, restarts = backend.server.proc.pid, backend.server.restarts
            httpx.post(f"{backend.url}/standin/fault", json={"kind": "crash"})
            after = self._gen(engine, tiny_model_dir, temperature=0.0, max_new_tokens=8)[0]
            assert backend.server.restarts == restarts + 1
            assert backend.server.proc.pid != old_pid
            with pytest.raises(ProcessLookupError):
                os.kill(old_pid, 0)
            assert after.version == version
            assert after.token_ids == before.token_ids
            assert after.logprobs == pytest.approx(before.logprobs, abs=1e-4)
        finally:
            loop.run(_reload(backend, tiny_model_dir, version + 1))


def test_a_chat_checkpoint_samples_the_trainers_log_probs(standin_on_path, chat_model_dir,
                                                          tmp_path):
    """A user's checkpoint (byte-level BPE, ChatML template, tied embeddings, two stop ids):
    the node renders the chat prompt, the server samples token ids only (it never
    tokenizes), and the HF trainer recomputes the same log-probs."""
    from astraflow.testing.rollout import logprob_gap

    worst, count = logprob_gap("sglang", "hf", chat_model_dir, prompts=("12+7=", "9+9="),
                               raas_config=standin_config(tmp_path))
    assert count >= 8
    assert worst < 1e-4


def test_adapters_are_served_by_name_with_the_trainers_log_probs(standin_on_path,
                                                                 tiny_model_dir, tmp_path):
    """LoRA: the server starts with --enable-lora; an adapter is loaded by name and a
    request that names it samples the log-probs a LoRA trainer holding it computes."""
    from astraflow.testing.rollout import logprob_gap, make_adapter

    adapter = make_adapter(tiny_model_dir, tmp_path / "adapter")
    worst, count = logprob_gap("sglang", "hf", tiny_model_dir, adapter=adapter,
                               raas_config=standin_config(tmp_path / "logs"))
    assert count >= 8
    assert worst < 1e-4


def test_each_adapter_version_replaces_the_last_and_stamps_its_generations(
        standin_on_path, tiny_model_dir, tmp_path):
    from astraflow.testing.rollout import make_adapter, prompt_ids
    from astraflow.types import GenerationRequest

    first = make_adapter(tiny_model_dir, tmp_path / "v1", seed=1)
    second = make_adapter(tiny_model_dir, tmp_path / "v2", seed=2)
    backend = SGLangRolloutBackend(standin_config(tmp_path / "logs"), tiny_model_dir)
    backend.configure_adapters(16, ["solver", "verifier"])
    loop = LoopThread()
    loop.run(backend.start())
    try:
        assert "--enable-lora" in backend.server.command()
        ids = prompt_ids(tiny_model_dir, "12+7=")

        def greedy(adapter):
            [gen] = loop.run(backend.generate(GenerationRequest(
                ids, max_new_tokens=6, temperature=0.0, adapter=adapter)))
            return gen

        base = greedy("solver")  # nothing loaded yet: version 0, the base model
        assert base.version == 0
        for version, path in ((1, first), (2, second)):
            loop.run(backend.pause())
            loop.run(backend.load_adapter("solver", str(path), version))
            loop.run(backend.resume())
        solver, verifier = greedy("solver"), greedy("verifier")
        assert solver.version == 2 and verifier.version == 0
        assert verifier.token_ids == base.token_ids
        assert solver.logprobs != base.logprobs  # the adapter changes the model
        calls = httpx.get(f"{backend.url}/standin/calls").json()
        lora_calls = [(c["route"], c["body"]["lora_name"]) for c in calls
                      if "lora" in c["route"]]
        assert lora_calls == [("/load_lora_adapter", "solver-v1"),
                              ("/load_lora_adapter", "solver-v2"),
                              ("/unload_lora_adapter", "solver-v1")]
    finally:
        loop.run(backend.shutdown())
        loop.close()


def test_a_server_that_cannot_start_is_reported_with_its_log(standin_on_path, tmp_path):
    children_before = _children()
    backend = SGLangRolloutBackend(standin_config(tmp_path), str(tmp_path / "no-model"))
    loop = LoopThread()
    try:
        with pytest.raises(SGLangServerError, match="exited with code 2 while starting"
                           r"(.|\n)*is not a directory"):
            loop.run(backend.start())
        loop.run(backend.shutdown())
    finally:
        loop.close()
    assert _children() <= children_before


def test_an_unreachable_url_is_reported(tmp_path):
    backend = SGLangRolloutBackend(standin_config(tmp_path, url="http://127.0.0.1:9"), "unused")
    loop = LoopThread()
    try:
        with pytest.raises(SGLangServerError, match=r"no answer from the SGLang server at "
                           r"http://127.0.0.1:9/get_model_info"):
            loop.run(backend.start())
        loop.run(backend.shutdown())
    finally:
        loop.close()


def test_an_unknown_pause_mode_is_a_config_error():
    from astraflow.config import compose_config
    from astraflow.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        compose_config(["raas=sglang", "raas.pause_mode=drain"])
    assert str(info.value) == "raas.pause_mode=drain: choose abort, retract or in_place"


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None,
                    reason="SGLang is installed here: selecting it is allowed")
def test_selecting_sglang_without_it_fails_fast_with_install_advice(tmp_path):
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "astraflow", "+raas=sglang", "steps=1",
                           f"run_dir={tmp_path / 'run'}"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "needs SGLang, which installs only on a GPU (CUDA) machine" in proc.stderr
    assert "pip install 'astraflow-plugin-raas-sglang[gpu]'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists(), "something started before the check"
    assert time.time() - started < 60


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None,
                    reason="SGLang is installed here: every selection is allowed")
def test_attaching_by_url_needs_no_local_sglang_but_starting_one_does():
    from astraflow_raas_sglang.errors import SGLangUnavailableError

    from astraflow.config import compose_config
    from astraflow.launch.preflight import check_backends

    check_backends(compose_config(["+raas=sglang", "raas.url=http://gpu-host:30000"]))
    with pytest.raises(SGLangUnavailableError, match="needs SGLang"):
        check_backends(compose_config(["+raas=sglang"]))
