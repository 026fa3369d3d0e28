"""The contract every trainer backend passes, run on the tiny local model.

A backend plugin's tests subclass it::

    from astraflow.testing.trainer import TrainerBackendContract

    class TestMyTrainer(TrainerBackendContract):
        backend_name = "mine"

and may override the ``backend_config`` fixture. The backend is built through the
plugin registry with its config as the runtime passes it (an OmegaConf node), so the
suite exercises exactly what ``trainer=<name>`` selects. Imports torch: import it
only from a backend's tests.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
from omegaconf import OmegaConf
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from astraflow.contracts import TrainerBackend
from astraflow.plugins import get_registry
from astraflow.rl.losses import token_logprobs
from astraflow.tasks.arithmetic import ArithmeticTasks
from astraflow.text import load_tokenizer
from astraflow.types import PROMPT, Batch, Span, TrainItem, Trajectory

if TYPE_CHECKING:
    import torch
else:
    torch = pytest.importorskip("torch")  # a trainer suite needs torch; the core does not

MakeBackend = Callable[[], TrainerBackend]


def arithmetic_batch(model_dir: str, advantages: Sequence[float], batch_id: str = "batch") -> Batch:
    """Prompt + correct answer + <eos> per held-out problem, answer tokens trained.

    Behaviour log-probs are left at 0.0: :func:`with_behaviour_logprobs` fills them.
    """
    tokenizer = load_tokenizer(model_dir)
    items = []
    for task, advantage in zip(ArithmeticTasks().eval_tasks(), advantages, strict=False):
        prompt = tokenizer.encode(cast(str, task.prompt))  # arithmetic prompts are text
        answer = [*tokenizer.encode(task.answer or ""), tokenizer.eos_token_id]
        trajectory = prompt_completion(task.task_id, prompt, answer, float(advantage > 0))
        items.append(TrainItem(trajectory, float(advantage)))
    return Batch(batch_id=batch_id, policy="policy", items=items)


def prompt_completion(task_id: str, prompt: list[int], completion: list[int],
                      reward: float, policy: str = "policy") -> Trajectory:
    """One turn of ``policy`` at version 0: the prompt as context, the completion trained
    (behaviour log-probs 0.0 until :func:`with_behaviour_logprobs`)."""
    n = len(prompt) + len(completion)
    return Trajectory(
        task_id=task_id, group_id=task_id, policy=policy, tokens=prompt + completion,
        logprobs=[0.0] * n, loss_mask=[0] * len(prompt) + [1] * len(completion),
        versions=[-1] * len(prompt) + [0] * len(completion),
        spans=[Span(0, len(prompt), PROMPT), Span(len(prompt), n, policy, 0)], reward=reward)


def with_behaviour_logprobs(backend: TrainerBackend, batch: Batch) -> Batch:
    """Stamp the current policy's log-probs on trained tokens, as a rollout engine would."""
    for item, logp in zip(batch.items, backend.compute_logprobs(batch), strict=True):
        traj = item.trajectory
        traj.logprobs = [lp if m else 0.0 for lp, m in zip(logp, traj.loss_mask, strict=True)]
    return batch


def trained_logprob(backend: TrainerBackend, batch: Batch) -> list[float]:
    """Each sequence's total log-prob over its trained tokens."""
    return [
        sum(lp for lp, m in zip(logp, item.trajectory.loss_mask, strict=True) if m)
        for logp, item in zip(backend.compute_logprobs(batch), batch.items, strict=True)
    ]


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@torch.no_grad()
def _direct_logprobs(model: Any, batch: Batch) -> list[list[float]]:
    """One unpadded forward per sequence: the reference for a backend's batched path."""
    out = []
    for item in batch.items:
        ids = torch.tensor([item.trajectory.tokens])
        out.append(token_logprobs(model(input_ids=ids).logits, ids)[0].tolist())
    return out


class TrainerBackendContract:
    """What any trainer backend must do; subclasses set ``backend_name``."""

    backend_name: str = ""
    #: tolerance of the backend's log-probs against a float32 transformers forward
    logprob_atol: float = 1e-4
    #: tolerance of log-probs under the exported weights (a bf16 export rounds)
    export_logprob_atol: float = 0.25
    #: the small step of the advantage-sign test (LoRA adapters start at zero and need more)
    sign_lr: float = 3e-5
    #: settings over the backend's defaults (``backend_config``)
    settings: dict[str, Any] = {}

    @pytest.fixture
    def backend_config(self) -> Any:
        """The backend's default config with ``settings``, as the trainer runtime
        receives it."""
        entry = get_registry().get("trainer_backend", self.backend_name)
        if entry.config_cls is None:
            return None
        return OmegaConf.merge(OmegaConf.structured(entry.config_cls), self.settings)

    @pytest.fixture
    def make_backend(self, backend_config: Any, tiny_model_dir: str) -> MakeBackend:
        entry = get_registry().get("trainer_backend", self.backend_name)
        return lambda: entry.create(backend_config, tiny_model_dir)

    @pytest.fixture
    def batch(self, tiny_model_dir: str) -> Batch:
        return arithmetic_batch(tiny_model_dir, [1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 1.0, -1.0])

    def test_train_step_returns_finite_metrics_and_changes_weights(
        self, make_backend: MakeBackend, batch: Batch
    ) -> None:
        backend = make_backend()
        before = backend.export_weights()
        metrics = backend.train_step(with_behaviour_logprobs(backend, batch))
        assert {"loss", "grad_norm", "tokens"} <= metrics.keys()
        assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values()), metrics
        trained = sum(sum(item.trajectory.loss_mask) for item in batch.items)
        assert metrics["tokens"] == trained
        after = backend.export_weights()
        # some elements may round back to their old value (bf16), but not every tensor
        assert any(not torch.equal(before[name], after[name]) for name in before)

    def test_advantage_sign_moves_the_sequence_logprob(
        self, backend_config: Any, tiny_model_dir: str
    ) -> None:
        """In one batch, the rewarded answer gains log-prob and the penalised one loses it.

        The step is small (lr 3e-5) so the test sees the first-order effect of each sign.
        At a default-sized lr, Adam's first, sign-sized step overshoots on a model this
        small, and the two answers' shared tokens (a leading digit, <eos>) can drag the
        rewarded one down for a step or two, depending on how the warm start rounded on
        the machine that built the model.
        """
        entry = get_registry().get("trainer_backend", self.backend_name)
        backend = entry.create(OmegaConf.merge(backend_config, {"lr": self.sign_lr}),
                               tiny_model_dir)
        batch = arithmetic_batch(tiny_model_dir, [1.0, -1.0])
        start = trained_logprob(backend, batch)
        for _ in range(3):
            backend.train_step(with_behaviour_logprobs(backend, batch))
        rewarded, penalised = trained_logprob(backend, batch)
        assert rewarded > start[0] + 0.05
        assert penalised < start[1] - 0.05

    def test_masked_tokens_do_not_change_the_update(
        self, make_backend: MakeBackend, tiny_model_dir: str
    ) -> None:
        """Prompt and other-policy tokens carry no gradient, whatever they hold."""

        def step(garbage: float) -> dict[str, torch.Tensor]:
            backend = make_backend()
            batch = arithmetic_batch(tiny_model_dir, [1.0, -1.0, garbage])
            with_behaviour_logprobs(backend, batch)
            for item in batch.items:
                traj = item.trajectory
                traj.logprobs = [
                    lp if m else garbage
                    for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True)
                ]
            untrained = batch.items[2].trajectory
            untrained.loss_mask = [0] * len(untrained.tokens)
            untrained.versions = [-1] * len(untrained.tokens)
            untrained.spans = [Span(0, len(untrained.tokens), "other_policy", 0)]
            backend.train_step(batch)
            return backend.export_weights()

        assert _same(step(0.0), step(-37.5))

    def test_compute_logprobs_matches_a_direct_forward(
        self, make_backend: MakeBackend, batch: Batch, tiny_model_dir: str
    ) -> None:
        got = make_backend().compute_logprobs(batch)
        model = AutoModelForCausalLM.from_pretrained(
            tiny_model_dir, dtype=torch.float32, local_files_only=True
        )
        expected = _direct_logprobs(model, batch)
        assert [len(x) for x in got] == [len(item.trajectory.tokens) for item in batch.items]
        assert all(x[0] == 0.0 for x in got)
        for g, e in zip(got, expected, strict=True):
            assert torch.allclose(torch.tensor(g), torch.tensor(e), atol=self.logprob_atol)

    def test_exported_weights_load_into_transformers(
        self, make_backend: MakeBackend, batch: Batch, tiny_model_dir: str, tmp_path: Path
    ) -> None:
        backend = make_backend()
        backend.train_step(with_behaviour_logprobs(backend, batch))
        exported = backend.export_weights()
        snapshot = {k: v.clone() for k, v in exported.items()}
        (dtype,) = {t.dtype for t in exported.values()}

        export_dir = tmp_path / "exported"
        export_dir.mkdir()
        save_file(
            {k: v.contiguous() for k, v in exported.items()}, export_dir / "model.safetensors"
        )
        shutil.copy(Path(tiny_model_dir) / "config.json", export_dir / "config.json")
        from_export = AutoModelForCausalLM.from_pretrained(
            export_dir, dtype=dtype, local_files_only=True
        )
        assert set(from_export.state_dict()) == set(exported)

        backend.save_pretrained(str(tmp_path / "pretrained"))
        from_pretrained = AutoModelForCausalLM.from_pretrained(
            tmp_path / "pretrained", dtype=dtype, local_files_only=True
        )
        ids = torch.tensor([batch.items[0].trajectory.tokens])
        with torch.no_grad():
            assert torch.equal(
                from_export(input_ids=ids).logits, from_pretrained(input_ids=ids).logits
            )
        for got, trained in zip(
            _direct_logprobs(from_export, batch), backend.compute_logprobs(batch), strict=True
        ):
            close = torch.allclose(
                torch.tensor(got), torch.tensor(trained), atol=self.export_logprob_atol
            )
            assert close, "the exported weights sample from a different policy than trained"

        backend.train_step(with_behaviour_logprobs(backend, batch))
        assert _same(exported, snapshot), "export_weights must return a snapshot, not live views"

    def test_learning_rate_follows_the_schedule(
        self, backend_config: Any, tiny_model_dir: str, batch: Batch
    ) -> None:
        """Two warm-up steps up to ``lr``, then cosine decay towards ``0.1 * lr``."""
        config = OmegaConf.merge(backend_config, {
            "lr": 1e-3, "lr_schedule": "cosine", "warmup_steps": 2, "total_steps": 4,
            "min_lr_ratio": 0.1})
        backend = get_registry().get("trainer_backend", self.backend_name).create(
            config, tiny_model_dir)
        seen = []
        for _ in range(4):
            metrics = backend.train_step(with_behaviour_logprobs(backend, batch))
            assert {g["lr"] for g in backend.optimizer.param_groups} == {metrics["lr"]}
            seen.append(metrics["lr"])
        assert seen == pytest.approx([5e-4, 1e-3, 1e-3, 5.5e-4])

    def test_m2po_over_one_micro_batch_bounds_from_its_training_pass(
        self, backend_config: Any, tiny_model_dir: str
    ) -> None:
        """M2PO's bounds are the whole batch's. Over micro-batches a no-grad pass gives
        them before the first backward; over one micro-batch the training pass itself
        does: the model runs as often as in a PPO step, with the same bounds and the
        same update as over micro-batches of two."""
        entry = get_registry().get("trainer_backend", self.backend_name)

        def step(loss: str, micro_batch_size: int) -> tuple[dict, dict, int]:
            backend = entry.create(OmegaConf.merge(backend_config, {
                "loss": loss, "m2po_tau": 1e-6, "micro_batch_size": micro_batch_size}),
                tiny_model_dir)
            batch = with_behaviour_logprobs(backend, arithmetic_batch(
                tiny_model_dir, [1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 1.0, -1.0]))
            # stale samples: the behaviour log-probs of weights that have moved since
            for n, item in enumerate(batch.items):
                traj = item.trajectory
                traj.logprobs = [lp + (0.05 if n % 2 else -0.05) * m
                                 for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True)]
            model = getattr(backend, "model", None)
            if not isinstance(model, torch.nn.Module):
                pytest.skip("counts the passes of the backend's torch module `model`")
            calls = [0]
            hook = model.register_forward_hook(
                lambda *_: calls.__setitem__(0, calls[0] + 1))
            metrics = backend.train_step(batch)
            hook.remove()
            return metrics, backend.export_weights(), calls[0]

        whole, whole_weights, whole_calls = step("m2po", 8)
        split, split_weights, _ = step("m2po", 2)
        _, _, ppo_calls = step("ppo", 8)
        assert whole["m2po_clip_active"] == 1.0
        assert (whole["m2po_eps_low"], whole["m2po_eps_high"]) == pytest.approx(
            (split["m2po_eps_low"], split["m2po_eps_high"]), rel=1e-6)
        assert whole["loss"] == pytest.approx(split["loss"], rel=1e-4, abs=1e-7)
        assert all(torch.allclose(whole_weights[k].float(), split_weights[k].float(),
                                  atol=1e-2) for k in whole_weights)
        assert whole_calls == ppo_calls

    def test_checkpoint_resumes_bit_exactly(
        self, make_backend: MakeBackend, tiny_model_dir: str, tmp_path: Path
    ) -> None:
        first = arithmetic_batch(tiny_model_dir, [1.0, -1.0, 0.5, -0.5], "first")
        second = arithmetic_batch(tiny_model_dir, [-1.0, 1.0, -0.5, 0.5], "second")
        original = make_backend()
        original.train_step(with_behaviour_logprobs(original, first))
        original.save_checkpoint(str(tmp_path / "ckpt"))
        expected_metrics = original.train_step(with_behaviour_logprobs(original, second))

        resumed = make_backend()
        resumed.load_checkpoint(str(tmp_path / "ckpt"))
        metrics = resumed.train_step(with_behaviour_logprobs(resumed, second))
        assert metrics == expected_metrics
        assert _same(resumed.export_weights(), original.export_weights())
        assert resumed.compute_logprobs(first) == original.compute_logprobs(first)


def contract_suites(backend_name: str) -> tuple[type, ...]:
    """The contract as every backend runs it: in float32; with M2PO and a KL reference,
    accumulated over micro-batches of two sequences; and in bfloat16 (log-probs round,
    checkpoints still resume bit-exactly). A backend's test module binds them to names
    pytest collects::

        TestMine, TestMineM2POMicroBatched, TestMineBfloat16 = contract_suites("mine")
    """
    variants: dict[str, dict[str, Any]] = {
        "": {},
        "M2POMicroBatched": {"settings": {"loss": "m2po", "kl_coef": 0.05,
                                          "micro_batch_size": 2}},
        "Bfloat16": {"settings": {"dtype": "bfloat16"}, "logprob_atol": 0.15},
    }
    return tuple(type(f"Test{backend_name.title()}Trainer{suffix}", (TrainerBackendContract,),
                      {"backend_name": backend_name, **attrs})
                 for suffix, attrs in variants.items())


def run_ranks(backend_name: str, model_dir: str, out: Path, settings: dict[str, Any],
              timeout: float = 600) -> dict[str, Any]:
    """Run ``settings["world_size"]`` ranks of :mod:`astraflow.testing.rank_worker`,
    forked from one process that imported the backend; returns what rank 0 wrote."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "astraflow.testing.rank_worker",
           "--ranks", str(settings["world_size"]),
           backend_name, model_dir, str(out), json.dumps(settings)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads((out / "result.json").read_text())


def check_ranks_match_one_process(backend_name: str, model_dir: str, out: Path,
                                  settings: dict[str, Any], rel: float = 1e-5,
                                  logprob_atol: float = 1e-5, abs_tol: float = 1e-6) -> None:
    """A trainer of ``settings["world_size"]`` ranks against one process, on the same
    two batches: both steps' loss and metrics agree to ``rel``, the log-probs after
    step 1 to ``logprob_atol``; its checkpoint resumes in one process and one process's
    checkpoint resumes in it, each to the same next step; its final weights load in
    ``transformers`` and give the single process's log-probs."""
    from astraflow.testing.rank_worker import write_batch

    entry = get_registry().get("trainer_backend", backend_name)
    single_settings = {k: v for k, v in settings.items()
                       if k not in ("world_size", "tensor_model_parallel_size",
                                    "pipeline_model_parallel_size",
                                    "data_parallel_size", "cpu_offload",
                                    "expert_model_parallel_size")}
    config = OmegaConf.merge(OmegaConf.structured(entry.config_cls), single_settings)
    single = entry.create(config, model_dir)
    # 7 items: two replicas get 4 and 3, so micro-batching can leave one replica short
    batch1 = with_behaviour_logprobs(
        single, arithmetic_batch(model_dir, [1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 1.5], "b1"))
    batch2 = with_behaviour_logprobs(
        single, arithmetic_batch(model_dir, [-1.0, 1.0, 2.0, -0.5, 0.5, -2.0, 1.0], "b2"))
    out.mkdir(parents=True, exist_ok=True)
    write_batch(batch1, out / "batch1.json")
    write_batch(batch2, out / "batch2.json")
    step1 = single.train_step(batch1)
    logprobs1 = single.compute_logprobs(batch1)
    single.save_checkpoint(str(out / "single-checkpoint"))
    step2 = single.train_step(batch2)

    ranks = run_ranks(backend_name, model_dir, out, settings)

    def same_step(got: dict[str, float], want: dict[str, float], what: str) -> None:
        assert got.keys() == want.keys(), what
        for key, value in want.items():
            # the gap between trainer and behaviour log-probs is itself a log-prob
            # difference, so it agrees to the log-probs' tolerance, not the loss's
            tol = logprob_atol if key.startswith("rollout_logprob_gap") else abs_tol
            if key.endswith("_fraction") and logprob_atol >= 1e-2:
                # a share of tokens past a threshold: in reduced precision a token or
                # two near the threshold can fall on the other side
                tol = max(tol, 0.1)
            assert got[key] == pytest.approx(value, rel=rel, abs=tol), f"{what}: {key}"

    same_step(ranks["step1"], step1, "step 1")
    got = torch.tensor([x for row in ranks["logprobs1"] for x in row])
    want = torch.tensor([x for row in logprobs1 for x in row])
    assert (got - want).abs().max() < logprob_atol
    same_step(ranks["step2"], step2, "step 2")
    same_step(ranks["step2_from_single"], step2, "step 2 resumed from one process")

    resumed = entry.create(config, model_dir)  # the ranks' checkpoint, in one process
    resumed.load_checkpoint(str(out / "checkpoint"))
    same_step(resumed.train_step(batch2), step2, "step 2 resumed in one process")

    final = AutoModelForCausalLM.from_pretrained(str(out / "final"), local_files_only=True)
    direct = _direct_logprobs(final.float(), batch1)
    for row, want_row in zip(direct, single.compute_logprobs(batch1), strict=True):
        assert max(abs(a - b) for a, b in zip(row, want_row, strict=True)) < max(1e-3, logprob_atol)
