"""The shared contract suite every rollout backend passes.

Subclass it in the plugin's tests::

    class TestHFRollout(RolloutBackendContract):
        backend_name = "hf"

The engine is started once per class (engines can take seconds to start).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from astraflow.contracts import RolloutBackend
from astraflow.plugins import get_registry
from astraflow.testing.engine import LoopThread
from astraflow.types import Generation, GenerationRequest


def prompt_ids(model_dir: str, text: str) -> list[int]:
    from astraflow.text import load_tokenizer

    return load_tokenizer(model_dir).encode_prompt(text)


def perturbed_copy(model_dir: str, out_dir: Path, scale: float = 0.5) -> Path:
    """A full weight directory with every tensor shifted: outputs must change."""
    import torch
    from safetensors.torch import load_file, save_file

    state = load_file(os.path.join(model_dir, "model.safetensors"))
    gen = torch.Generator().manual_seed(0)
    noisy = {k: (v.float() + scale * torch.randn(v.shape, generator=gen)).to(v.dtype)
             for k, v in state.items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(noisy, str(out_dir / "model.safetensors"))
    return out_dir


def _children() -> set[int]:
    """Live child processes of this process (read from /proc: no helper process)."""
    me, out = os.getpid(), set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] != "Z":
            out.add(int(stat.parent.name))
    return out


class RolloutBackendContract:
    backend_name: str = ""

    @pytest.fixture(scope="class")
    @classmethod
    def backend_config(cls) -> Any:
        entry = get_registry().get("rollout_backend", cls.backend_name)
        return OmegaConf.structured(entry.config_cls) if entry.config_cls else None

    @pytest.fixture(scope="class")
    @classmethod
    def engine(cls, backend_config, tiny_model_dir):
        children_before = _children()
        entry = get_registry().get("rollout_backend", cls.backend_name)
        backend = entry.create(backend_config, tiny_model_dir)
        loop = LoopThread()
        loop.run(backend.start())
        yield loop, backend
        loop.run(backend.shutdown())
        loop.close()
        assert _children() <= children_before, "the engine left child processes behind"

    def _req(self, model_dir: str, text: str = "12+7=", **kw) -> GenerationRequest:
        kw.setdefault("max_new_tokens", 6)
        return GenerationRequest(prompt_ids=prompt_ids(model_dir, text), **kw)

    def test_generates_n_samples_with_a_logprob_per_token(self, engine, tiny_model_dir):
        loop, backend = engine
        gens = loop.run(backend.generate(self._req(tiny_model_dir, n=5, max_new_tokens=7)))
        assert len(gens) == 5
        for gen in gens:
            assert 1 <= len(gen.token_ids) <= 7
            assert len(gen.logprobs) == len(gen.token_ids)
            assert all(lp <= 1e-4 for lp in gen.logprobs)
            assert gen.finish_reason in ("stop", "length")
            assert gen.version == backend.version

    def test_generation_ends_at_a_stop_token(self, engine, tiny_model_dir):
        loop, backend = engine
        from astraflow.text import load_tokenizer

        tok = load_tokenizer(tiny_model_dir)
        stops = [tok.encode(c)[0] for c in "0123456789"]
        gens = loop.run(backend.generate(self._req(tiny_model_dir, n=8, max_new_tokens=12,
                                                   stop_token_ids=stops)))
        for gen in gens:
            hits = [i for i, t in enumerate(gen.token_ids) if t in stops]
            if gen.finish_reason == "stop":
                assert hits == [len(gen.token_ids) - 1]
            else:
                assert not hits and len(gen.token_ids) == 12

    def test_concurrent_requests_are_all_served(self, engine, tiny_model_dir):
        loop, backend = engine

        async def many():
            reqs = [self._req(tiny_model_dir, f"{i}+{i}=", n=1 + i % 3) for i in range(12)]
            return await asyncio.gather(*(backend.generate(r) for r in reqs))

        results = loop.run(many())
        assert [len(r) for r in results] == [1 + i % 3 for i in range(12)]

    def test_greedy_is_deterministic(self, engine, tiny_model_dir):
        loop, backend = engine
        req = self._req(tiny_model_dir, "3-9=", temperature=0.0)
        a = loop.run(backend.generate(req))[0]
        b = loop.run(backend.generate(req))[0]
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)

    def test_load_weights_changes_outputs_and_version(self, engine, tiny_model_dir, tmp_path):
        loop, backend = engine
        req = self._req(tiny_model_dir, "20-13=", temperature=0.0, max_new_tokens=8)
        before = loop.run(backend.generate(req))[0]
        noisy = perturbed_copy(tiny_model_dir, tmp_path / "noisy")
        original = Path(tiny_model_dir)

        async def reload(path, version):
            await backend.pause()
            await backend.load_weights(str(path), version)
            await backend.resume()

        loop.run(reload(noisy, backend.version + 1))
        after = loop.run(backend.generate(req))[0]
        assert after.version == before.version + 1
        assert (after.token_ids, after.logprobs) != (before.token_ids, before.logprobs)
        loop.run(reload(original, backend.version + 1))
        again = loop.run(backend.generate(req))[0]
        assert again.token_ids == before.token_ids
        assert again.logprobs == pytest.approx(before.logprobs, abs=1e-3)

    def test_pause_holds_new_generation_until_resume(self, engine, tiny_model_dir):
        loop, backend = engine

        async def scenario():
            await backend.pause()
            task = asyncio.ensure_future(backend.generate(self._req(tiny_model_dir)))
            done, _ = await asyncio.wait({task}, timeout=0.5)
            held = not done
            await backend.resume()
            gens = await asyncio.wait_for(task, timeout=120)
            return held, gens

        held, gens = loop.run(scenario())
        assert held, "a request completed while the engine was paused"
        assert len(gens) == 1


    def test_swap_weights_under_a_long_generation(self, engine, tiny_model_dir, tmp_path):
        """Partial rollouts: weights swapped while a long generation runs. An engine that
        supports it returns from the swap before that generation ends, which goes on
        with the new weights, each token labelled with the version that sampled it; one
        that does not finishes it on one version."""
        loop, backend = engine
        old = backend.version
        noisy = perturbed_copy(tiny_model_dir, tmp_path / "noisy", scale=0.05)
        gen, order = loop.run(self._swap_during(backend, tiny_model_dir, noisy, old + 1))
        versions = gen.versions()
        assert len(versions) == len(gen.token_ids) == LONG
        assert versions == sorted(versions) and set(versions) <= {old, old + 1}
        assert gen.version == versions[0]
        if backend.supports_partial_rollouts:
            assert order == ["swap", "generation"]
            assert versions[-1] == old + 1, "the tokens after the swap kept the old version"
        else:
            assert len(set(versions)) == 1

    async def _swap_during(self, backend: RolloutBackend, model_dir: str, path: Path | str,
                           version: int, started: Callable[[], bool] | None = None
                           ) -> tuple[Generation, list[str]]:
        """Generate LONG tokens greedily while ``path`` is swapped in as ``version`` (once
        ``started()``, if given, says the generation is under way); the generation and
        which of the two finished first. The original weights are back after it."""
        from astraflow.text import load_tokenizer

        # padding as the only stop token: the model never samples it greedily, so the
        # generation runs its whole length
        never = load_tokenizer(model_dir).pad_token_id
        req = self._req(model_dir, "12+30=", temperature=0.0, max_new_tokens=LONG,
                        stop_token_ids=[never])
        order: list[str] = []
        task = asyncio.ensure_future(backend.generate(req))
        task.add_done_callback(lambda _: order.append("generation"))
        await asyncio.sleep(0)  # the request reaches the engine before the swap
        while started is not None and not started() and not task.done():
            await asyncio.sleep(0.001)
        try:
            await backend.swap_weights(str(path), version)
            order.append("swap")
            gen = (await asyncio.wait_for(task, timeout=300))[0]
        finally:
            await backend.swap_weights(model_dir, version + 1)
        return gen, order


#: tokens of the generation under which the swap tests load weights
LONG = 200


def make_adapter(model_dir: str, out_dir: Path, rank: int = 16, scale: float = 0.3,
                 seed: int = 0, target_modules: Any = None) -> Path:
    """A LoRA adapter of ``model_dir`` as a trainer publishes it and a node hands it to
    its engine (``peft`` layout), far from zero so that it changes the outputs. Its
    values are bfloat16-exact, so the engine and a float32 trainer hold the same ones."""
    import torch

    from astraflow.weights.base import write_peft_dir
    from astraflow.weights.safetensors_io import from_torch, save

    entry = get_registry().get("trainer_backend", "hf")
    config = OmegaConf.structured(entry.config_cls)
    config.lora.rank = rank
    if target_modules is not None:
        config.lora.target_modules = target_modules
    backend = entry.create(config, model_dir)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in backend.model.named_parameters():
            if param.requires_grad:
                if ".lora_B." in name:
                    param.copy_(torch.randn(param.shape, generator=generator) * scale)
                param.copy_(param.to(torch.bfloat16).float())
    out_dir.mkdir(parents=True, exist_ok=True)
    save(out_dir / "model.safetensors",
         {k: from_torch(v) for k, v in backend.export_weights().items()})
    write_peft_dir(out_dir, {"config": backend.adapter_config()})
    return out_dir


def logprob_gap(raas: str, trainer: str, model_dir: str,
                prompts: tuple[str, ...] = ("12+7=", "3-15=", "20+20="),
                raas_config: Any = None, adapter: Path | None = None) -> tuple[float, int]:
    """Max |behaviour - recomputed| log-prob over the sampled tokens, and their count.

    ``raas`` samples 4 continuations per prompt and reports behaviour log-probs;
    ``trainer`` recomputes them for the same weights and tokens. Prompts are rendered
    as a node renders them: through the checkpoint's chat template when it has one.
    ``raas_config`` replaces the backend's default config (e.g. to start a stand-in).
    With ``adapter`` (:func:`make_adapter`) the engine serves it over ``model_dir`` and a
    LoRA trainer holding it recomputes.
    """
    gaps = logprob_gaps(raas, trainer, model_dir, prompts, raas_config, adapter)
    return gaps["adapter" if adapter is not None else "base"]


def logprob_gaps(raas: str, trainer: str, model_dir: str,
                 prompts: tuple[str, ...] = ("12+7=", "3-15=", "20+20="),
                 raas_config: Any = None, adapter: Path | None = None,
                 with_base: bool = False,
                 started: tuple[Any, LoopThread] | None = None) -> dict[str, tuple[float, int]]:
    """:func:`logprob_gap` as ``{"base": ..., "adapter": ...}``. With ``adapter`` and
    ``with_base`` one engine samples the base model, then loads the adapter and samples
    it, then the base again beside it (``"base beside the adapter"``): what a node serving
    every policy as an adapter of one engine serves at its start. Each is recomputed by
    the trainer of what sampled it. ``started``: an engine of ``raas`` already started
    (with its adapters configured) and the loop it runs on, left running."""
    import json

    from astraflow.text import load_tokenizer
    from astraflow.trajectory import TrajectoryBuilder
    from astraflow.types import TrainItem

    registry = get_registry()
    tok = load_tokenizer(model_dir)
    rank = 0
    if adapter is not None:
        rank = json.loads((Path(adapter) / "adapter_config.json").read_text())["r"]
    if started is None:
        entry = registry.get("rollout_backend", raas)
        engine = entry.create(raas_config if raas_config is not None
                              else OmegaConf.structured(entry.config_cls), model_dir)
        if adapter is not None:
            engine.configure_adapters(rank, ["policy"])
        loop = LoopThread()
        loop.run(engine.start())
    else:
        engine, loop = started
    # (what is sampled, its adapter): the base first, as a node serves a policy before
    # its first adapter arrives, and again beside the adapter (another policy's, whose
    # own has not arrived yet)
    served: list[tuple[str, str | None]] = (
        [("adapter", "policy")] if adapter is not None else [])
    if adapter is None or with_base:
        served.insert(0, ("base", None))
    if adapter is not None and with_base:
        served.append(("base beside the adapter", None))
    items: dict[str, list[Any]] = {what: [] for what, _ in served}
    try:
        for what, name in served:
            if name is not None:
                loop.run(engine.load_adapter(name, str(adapter), 1))
            for text in prompts:
                prompt = tok.encode_prompt(text)
                request = GenerationRequest(prompt, max_new_tokens=8, n=4,
                                            stop_token_ids=tok.stop_token_ids, adapter=name)
                for gen in loop.run(engine.generate(request)):
                    builder = TrajectoryBuilder(text, text)
                    builder.add_context(prompt)
                    builder.add_generation("policy", gen)
                    items[what].append(TrainItem(builder.build("policy", 0.0), 0.0))
    finally:
        if started is None:
            loop.run(engine.shutdown())
            loop.close()
    return {what: trainer_gap(trainer, model_dir, items[what],
                              adapter=adapter if name else None, rank=rank if name else 0)
            for what, name in served}


def trainer_gap(trainer: str, model_dir: str, items: list[Any], adapter: Path | None = None,
                rank: int = 0) -> tuple[float, int]:
    """Max |behaviour - recomputed| log-prob over the trained tokens of ``items``
    (:class:`~astraflow.types.TrainItem`), recomputed by ``trainer`` on ``model_dir``
    (with the rank-``rank`` LoRA ``adapter`` when given)."""
    import json

    from astraflow.types import Batch

    entry = get_registry().get("trainer_backend", trainer)
    config = OmegaConf.structured(entry.config_cls)
    if adapter is not None:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        config.lora.rank = rank
        saved = json.loads((Path(adapter) / "adapter_config.json").read_text())
        config.lora.target_modules = sorted(saved["target_modules"])
        backend = entry.create(config, model_dir)
        result = set_peft_model_state_dict(
            backend.model, load_file(str(Path(adapter) / "adapter_model.safetensors")))
        assert not result.unexpected_keys, result.unexpected_keys
    else:
        backend = entry.create(config, model_dir)
    worst, count = 0.0, 0
    for item, lps in zip(items, backend.compute_logprobs(Batch("b", "policy", items)),
                         strict=True):
        traj = item.trajectory
        for behaviour, trained, mask in zip(traj.logprobs, lps, traj.loss_mask, strict=True):
            if mask:
                worst, count = max(worst, abs(behaviour - trained)), count + 1
    return worst, count
