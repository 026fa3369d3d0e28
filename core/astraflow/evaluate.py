"""Held-out evaluation: a client of the weights interface only.

The evaluator follows a policy's weight stream and scores the task's eval split with
its own engine whenever the policy has advanced ``eval_every`` versions, and always
at version 0 and at the final version. ``eval_accuracy`` is the mean reward of
``eval_samples`` samples per task at the workflow's temperature -- the policy as it
is trained and deployed; ``eval_greedy_accuracy`` is temperature 0.

With ``eval_deferred`` the evaluator only keeps a copy of each version due (on its own
disk, under its work directory) while the policy trains, and scores them all once the
trainer is done: evaluating then takes no compute from the run, whose clock stays the
training's own (a benchmark; a machine with no device to spare for evaluation).

A task without a held-out split has nothing to score: the launcher starts no evaluator
for it, and one started anyway (``astraflow eval``) ends at once, without an engine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astraflow.components import build_workflow, role_map
from astraflow.lifecycle import mark_ready
from astraflow.plugins import get_registry
from astraflow.raas.engines import EnginePolicy, sampling_defaults, start_engines
from astraflow.raas.settings import NodeSettings, settings_from_config
from astraflow.rewards.base import reward_metric_means
from astraflow.schema import AstraFlowConfig, like
from astraflow.weights._fs import build_dir
from astraflow.weights.client import Synced

log = logging.getLogger("astraflow.eval")

_RUN = {f.name: f for f in dataclasses.fields(AstraFlowConfig)}


@dataclass(frozen=True)
class EvalSettings:
    """What an evaluator reads of a run: a node's settings (it runs the workflow on
    engines of its own) and when and how much to score."""

    node: NodeSettings
    eval_every: int = like(_RUN["eval_every"])
    eval_samples: int = like(_RUN["eval_samples"])
    eval_deferred: bool = like(_RUN["eval_deferred"])


def eval_settings(cfg: Any) -> EvalSettings:
    """Reduce a composed run config to an evaluator's settings."""
    return EvalSettings(settings_from_config(cfg), eval_every=int(cfg.eval_every),
                        eval_samples=int(cfg.eval_samples),
                        eval_deferred=bool(cfg.get("eval_deferred", False)))


class Evaluator:
    def __init__(self, cfg: Any, url: str, token: str, policy: str, work_dir: str,
                 metrics_path: str) -> None:
        """``cfg``: the evaluator's settings, or the run config they are read from."""
        from astraflow.dataflow.client import DataflowClient
        from astraflow.weights.client import WeightClient

        self.settings = cfg if isinstance(cfg, EvalSettings) else eval_settings(cfg)
        self.policy = policy
        self.weights = WeightClient(url, token, os.path.join(work_dir, "eval-weights", policy),
                                    local_reads=True)
        self.client = DataflowClient(url, token)
        #: scores for the dashboard: a data layer away for long is not waited for
        self.reporter = DataflowClient(url, token, timeout=5.0, retry_for=10.0)
        self.metrics_path = Path(metrics_path)

    async def evaluate(self, backends, workflow, roles, tasks) -> dict[str, float]:
        """Mean reward on the held-out tasks: sampled like training, and greedy."""
        from omegaconf import OmegaConf

        base = workflow.config
        out = {}
        for key, temperature, samples in (
            ("eval_accuracy", sampling_defaults(base)["temperature"],
             self.settings.eval_samples),
            ("eval_greedy_accuracy", 0.0, 1),
        ):
            workflow.config = OmegaConf.merge(base, {"temperature": temperature})
            defaults = {**sampling_defaults(base), "temperature": temperature}
            handles = {role: EnginePolicy(p, backends[p], defaults) for role, p in roles.items()}
            results = await asyncio.gather(*(workflow.run(t, handles, samples) for t in tasks))
            # a workflow marks trajectories that are not the policy's answer to the
            # task (a solver's retry after a verdict) ``eval: false``
            mine = [traj for trajs in results for traj in trajs
                    if roles.get(traj.policy, traj.policy) == self.policy
                    and traj.metadata.get("eval", True)]
            # a sample whose reward failed scores 0 here: held-out accuracy never looks
            # better because the reward broke; the failures are counted beside it
            out[key] = sum(t.reward for t in mine) / max(len(mine), 1)
            prefix = key.removesuffix("_accuracy")
            out[f"{prefix}_reward_failed"] = sum(t.outcome.failed for t in mine)
            # the reward's extra metrics (a pair's final accuracy beside the solver's own)
            for name, value in reward_metric_means([t.outcome for t in mine]).items():
                out[f"{prefix}_{name.removeprefix('reward/')}"] = value
        workflow.config = base
        return out

    def trainer_done(self) -> bool:
        """The policy's trainer left the data layer: it leaves only after publishing its
        last version. Asked over the data layer, so the evaluator may run on any machine."""
        nodes = self.client.status()["nodes"]
        return any(n["node_id"] == f"trainer-{self.policy}" and n["state"] == "left"
                   for n in nodes)

    async def run(self) -> None:
        """Evaluate version 0, then every ``eval_every`` versions, then the final one
        (once the policy's trainer is done)."""
        from astraflow.text import load_tokenizer

        s, node = self.settings, self.settings.node
        tokenizer = load_tokenizer(node.model_path).configure(node.task)
        workflow = build_workflow(node, tokenizer)
        roles = role_map(node, workflow.roles)
        tasks = get_registry().get("task", node.task.name).create(node.task).eval_tasks()
        # one engine per policy (or one serving each as an adapter): the other policies
        # play their part at their newest version
        engines: list = []
        backends: dict = {}
        policies = list(dict.fromkeys(roles.values()))
        deferred = s.eval_deferred
        #: deferred: the versions kept until training ends, each with the weights of
        #: every policy its workflow runs
        kept: list[tuple[int, dict[str, Synced]]] = []

        async def score(version: int, weights: dict[str, Synced]) -> None:
            for policy, synced in weights.items():
                await backends[policy].load(synced.path, synced.version)
            self._log(version, await self.evaluate(backends, workflow, roles, tasks))

        async def take(version: int | None) -> int:
            """Sync the policy to ``version`` (the others to their newest), then score
            it now, or keep a copy to score once training ends."""
            weights: dict[str, Synced] = {}
            for policy in policies:
                synced = await asyncio.to_thread(self.weights.sync, policy,
                                                 version if policy == self.policy else None)
                weights[policy] = (Synced(synced.version, await asyncio.to_thread(
                    self._keep, policy, synced.path)) if deferred else synced)
            version = weights[self.policy].version
            if deferred:
                kept.append((version, weights))
            else:
                await score(version, weights)
            return version

        try:
            if not tasks:  # no held-out split (the launcher starts no evaluator then): no
                # engine, a copy of the model, is held for nothing to score
                log.info("task=%s has no held-out tasks: nothing to evaluate for %s",
                         node.task.name, self.policy)
                mark_ready()
                return
            last = 0
            if deferred:  # the start weights too, as the trainer published them; the
                # engines start when training is done, their start-up none of its CPU
                while await asyncio.to_thread(self.weights.latest, self.policy) is None:
                    await asyncio.sleep(0.2)
                await take(0)
            else:  # the engines hold the start weights
                backends.update(await start_engines(node, policies, engines, train=False))
                self._log(0, await self.evaluate(backends, workflow, roles, tasks))
            mark_ready()
            while True:
                latest = await asyncio.to_thread(self.weights.latest, self.policy)
                # eval_every=0: version 0 and the final one alone
                due = (latest is not None and s.eval_every > 0
                       and latest - last >= s.eval_every)
                # the status is asked for only when no evaluation is due anyway
                done = not due and await asyncio.to_thread(self.trainer_done)
                if done:  # read again: the trainer published its last version before it
                    # left, maybe after the read above
                    latest = await asyncio.to_thread(self.weights.latest, self.policy)
                if latest is not None and latest > last and (done or due):
                    last = await take(latest)
                elif done:
                    if kept:
                        log.info("training is done: scoring %d kept versions of %s",
                                 len(kept), self.policy)
                        backends.update(await start_engines(node, policies, engines, train=False))
                    for i, (version, weights) in enumerate(kept):
                        await score(version, weights)
                        later = {s.path for _, w in kept[i + 1:] for s in w.values()}
                        for synced in weights.values():  # a real model's copy is GBs
                            if synced.path not in later:
                                shutil.rmtree(synced.path, ignore_errors=True)
                    return
                else:
                    await asyncio.sleep(0.5)
        finally:
            for engine in engines:
                await engine.shutdown()
            self.client.close()
            self.reporter.close()

    def _keep(self, policy: str, path: Path) -> Path:
        """A copy of a synced version that the next sync leaves alone."""
        kept = self.weights.local_dir.parent / "kept" / self.policy / policy / path.name
        if not kept.exists():
            build_dir(kept, lambda tmp: shutil.copytree(path, tmp, dirs_exist_ok=True),
                      Path.exists)
        return kept

    def _log(self, version: int, accuracies: dict[str, float]) -> None:
        record = {"kind": "eval", "policy": self.policy, "version": version, **accuracies,
                  "time": time.time()}
        log.info("eval %s v%d: %s", self.policy, version, accuracies)
        try:  # the dashboard's curve; the metric stream below is the record
            self.reporter.report_eval(self.policy, version, accuracies)
        except Exception as exc:
            log.warning("could not report eval %s v%d to the data layer: %s", self.policy,
                        version, exc)
        self.metrics_path.parent.mkdir(parents=True, exist_ok=True)
        with self.metrics_path.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
