"""The trainer runtime: pull a batch -> train step -> publish weights -> acknowledge.

To a trainer, AstraFlow is a streaming corpus plus a weight publication target. Before
it acknowledges a batch, the runtime either checkpoints (every ``checkpoint_interval``
seconds) or appends the batch to its journal (:mod:`astraflow.trainer.journal`), so a
trainer killed at any point resumes from its checkpoint, trains the journal's batches
again, and every batch it had not acknowledged is served again.

A trainer of several ranks (``trainer.world_size`` > 1, started by ``torchrun``) runs
this loop on rank 0 alone; the other ranks follow it (:mod:`astraflow.trainer.ranks`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import threading
import time
from collections import Counter
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from astraflow.components import trainer_settings
from astraflow.errors import ConfigError
from astraflow.lifecycle import mark_ready
from astraflow.plugins import get_registry
from astraflow.rewards.base import reward_metric_means
from astraflow.trainer import distributed
from astraflow.trainer.journal import BatchJournal

log = logging.getLogger("astraflow.trainer")


class TrainerRuntime:
    def __init__(self, cfg: DictConfig, url: str, token: str, policy: str, work_dir: str,
                 metrics_path: str | None = None) -> None:
        from astraflow.dataflow.client import DataflowClient

        self.cfg = cfg
        self.policy = policy
        self.url, self.token = url, token
        self.client = DataflowClient(url, token)
        self.work_dir = Path(work_dir)
        self.ckpt_dir = self.work_dir / "checkpoints" / policy
        self.journal = BatchJournal(self.work_dir / "checkpoints" / f"{policy}.journal")
        #: when the last checkpoint was written (monotonic)
        self.saved_at = time.monotonic()
        #: how long the last checkpoint took to write
        self.save_seconds = 0.0
        self.metrics_path = Path(metrics_path or self.work_dir / f"metrics-{policy}.jsonl")
        self.version = 0
        self.step = 0
        #: the batch the checkpoint already includes: killed before acknowledging it,
        #: the trainer is served it again and must ack it, not train on it twice
        self.trained_batch: str | None = None
        #: makes a backend call on every rank (rank 0's side; see ranks.Leader)
        self.call: Any = None

    def _build(self) -> Any:
        entry = get_registry().get("trainer_backend", self.cfg.trainer.name)
        return entry.create(trainer_settings(self.cfg, self.policy), self.cfg.model.path)

    def _adapter(self, backend: Any) -> dict[str, Any] | None:
        """What every version of a LoRA stream says of itself: its base and config."""
        config = backend.adapter_config()
        if config is None:
            return None
        from astraflow.weights.base import base_sha256

        path = self.cfg.model.path
        return {"base_sha256": base_sha256(path), "base_name": Path(path).name,
                "config": config}

    def _publish(self, publisher: Any, version: int, weights: dict[str, Any] | None = None
                 ) -> None:
        """Publish ``weights`` (a snapshot from ``export_weights``; default: take one now)."""
        from astraflow.weights.safetensors_io import from_torch

        weights = self.call("export_weights") if weights is None else weights
        # the snapshot is this publish's alone: its bits are shared, not copied, and the
        # publisher keeps them as the next delta's base
        publisher.publish(version, {name: from_torch(t, copy=False)
                                    for name, t in weights.items()}, owned=True)

    def _save(self, batch_id: str) -> None:
        started = time.monotonic()
        tmp = self.ckpt_dir.with_name(self.ckpt_dir.name + ".tmp")
        _rmtree(tmp)  # what a killed save left: shards of another world size must not mix in
        self.call("save_checkpoint", text=str(tmp))
        (tmp / "runtime.json").write_text(json.dumps({
            "version": self.version, "step": self.step, "batch_id": batch_id}))
        old = self.ckpt_dir.with_name(self.ckpt_dir.name + ".old")
        if self.ckpt_dir.exists():
            # only a complete checkpoint is ever renamed into place, so with one there a
            # leftover .old (a save killed between its renames or while removing it) is
            # stale; a rename onto a non-empty folder would fail
            _rmtree(old)
            os.replace(self.ckpt_dir, old)
        os.replace(tmp, self.ckpt_dir)
        self.journal.clear()  # killed before this, the replay skips what the checkpoint holds
        _rmtree(old)
        self.save_seconds = time.monotonic() - started
        self.saved_at = time.monotonic()

    def _interval(self) -> float:
        """Seconds from one checkpoint to the next: ``checkpoint_interval``, stretched so
        that writing checkpoints takes at most a tenth of the trainer's time (a 0.5B
        model's fp32 weights and AdamW moments are 6 GB: ~20 s to write here)."""
        interval = float(self.cfg.checkpoint_interval)
        return max(interval, 9 * self.save_seconds) if interval > 0 else 0.0

    def _resume(self) -> bool:
        for candidate in (self.ckpt_dir, self.ckpt_dir.with_name(self.ckpt_dir.name + ".old")):
            meta = candidate / "runtime.json"
            if meta.exists():
                self.call("load_checkpoint", text=str(candidate))
                state = json.loads(meta.read_text())
                self.version, self.step = state["version"], state["step"]
                self.trained_batch = state.get("batch_id")
                self._replay()
                return True
        # before its first checkpoint a trainer holds model.path and fresh moments, which
        # building it made again
        return self._replay()

    def _replay(self) -> bool:
        """Train the journal's batches again, back to the state this trainer was killed
        in; their versions were published already. Whether there were any."""
        entries = [entry for entry in self.journal.recover() if entry[0] > self.step]
        if not entries:
            return False
        t0 = time.time()
        for step, version, batch in entries:
            if step != self.step + 1:
                raise RuntimeError(f"{self.journal.path}: step {step} follows step "
                                   f"{self.step}; a record is missing")
            self.call("train_step", batch)
            self.step, self.version = step, version
            self.trained_batch = batch.batch_id
        log.info("trainer %s: trained the %d batches journalled since the checkpoint again "
                 "(%.1f s), now at step %d", self.policy, len(entries), time.time() - t0,
                 self.step)
        return True

    def _log(self, record: dict[str, Any]) -> None:
        self.metrics_path.parent.mkdir(parents=True, exist_ok=True)
        with self.metrics_path.open("a") as fh:
            fh.write(json.dumps(record) + "\n")

    def run(self, steps: int | None = None) -> None:
        steps = self.cfg.steps if steps is None else steps
        from astraflow.weights.client import HttpPublishTarget, WeightClient
        from astraflow.weights.publisher import WeightPublisher

        ranks = None
        if distributed():
            from astraflow.rl.options import parallel_sizes
            from astraflow.trainer.ranks import init

            ranks = init(float(self.cfg.trainer.get("collective_timeout", 600.0)))
            settings = trainer_settings(self.cfg, self.policy)
            world = int(settings.get("world_size", 1))
            parallel_sizes(settings)
            if ranks.world_size != world:
                raise ConfigError(f"torchrun started {ranks.world_size} ranks but "
                                  f"trainer.world_size={world}")
        backend = self._build()
        if ranks is not None and not ranks.leader:
            from astraflow.trainer.ranks import follow

            follow(backend, ranks)
            return
        from astraflow.trainer.ranks import Leader

        self.call = Leader(backend, ranks)
        # the last version's bits, the next delta's base, wait on disk: not in memory
        # on the data layer's machine, versions are put into its store's directory
        publisher = WeightPublisher(HttpPublishTarget(self.url, self.token, local_writes=True),
                                    self.policy,
                                    adapter=self._adapter(backend),
                                    base_path=self.work_dir / "trainer-weights"
                                    / f"{self.policy}.delta-base.safetensors")
        resumed = self._resume()
        with WeightClient(self.url, self.token, self.work_dir / "trainer-weights") as wc:
            latest = wc.latest(self.policy)
        if latest is None:
            self._publish(publisher, self.version)
        elif latest != self.version or not resumed:
            # the stream never goes backwards: republish what this trainer really holds
            self.version = max(latest, self.version) + 1
            self._publish(publisher, self.version)
        beats = _Heartbeats(self.url, self.token, f"trainer-{self.policy}", [self.policy])
        mark_ready()
        try:
            self._train(publisher, steps)
            self.call.stop()
        finally:
            beats.stop()
        # leaving tells the data layer no one consumes this policy any more, so it stops
        # holding the other policies back for it
        self.client.leave(f"trainer-{self.policy}")

    def _train(self, publisher: Any, steps: int) -> None:
        log.info("trainer %s: starting at step %d, version %d", self.policy, self.step,
                 self.version)
        batch_size = self.cfg.batch_size
        trainer_id = f"trainer-{self.policy}"

        def fetch(after: str | None, client: Any = self.client) -> Any:
            return client.get_batch(self.policy, batch_size, timeout=5.0,
                                    trainer_id=trainer_id, after=after)

        ahead = (_FetchAhead(self.url, self.token, fetch)
                 if self.cfg.get("fetch_ahead", True) else None)
        try:
            self._steps(publisher, steps, fetch, ahead)
        finally:
            if ahead is not None:
                ahead.close()

    def _steps(self, publisher: Any, steps: int, fetch: Any, ahead: _FetchAhead | None
               ) -> None:
        t0 = time.time()  # waiting starts when the previous step ended, across long-polls
        behind = _Behind() if self.cfg.get("overlap_publish", True) else None
        try:
            while self.step < steps:
                if ahead is not None and ahead.pending:
                    batch = ahead.take()
                else:
                    if behind is not None:
                        # asked without ``after`` the data layer serves the oldest held
                        # batch: the previous one must be acknowledged first
                        behind.wait()
                    batch = fetch(None)
                if batch is None:
                    self.call.idle()  # the other ranks wait for rank 0's next call
                    continue
                if batch.batch_id == self.trained_batch:
                    self.client.ack_batch(batch.batch_id, wait_seconds=0.0, step_seconds=0.0)
                    self.trained_batch = None
                    t0 = time.time()
                    continue
                if ahead is not None and self.step + 1 < steps:
                    # the next batch is composed and sent while this one trains (the data
                    # layer serves it for the version it will be trained at); a trainer
                    # holds two batches at most, so it is asked for once the previous one
                    # is acknowledged
                    ahead.start(batch.batch_id, behind.pending if behind else None)
                t1 = time.time()
                if self.cfg.get("record_batches"):
                    # the first step can come before the first metrics line made the folder
                    self.metrics_path.parent.mkdir(parents=True, exist_ok=True)
                    with self.metrics_path.with_name(f"batches-{self.policy}.jsonl").open(
                            "a") as fh:
                        fh.write(json.dumps({"step": self.step + 1, **batch.to_dict()}) + "\n")
                metrics = self.call("train_step", batch)
                self.version += 1
                self.step += 1
                t_trained = time.time()
                if behind is not None:
                    # one step's publish at a time, in order; waited for before the
                    # snapshot, so at most two are held (the last published, this one)
                    behind.wait()
                weights = self.call("export_weights")  # a snapshot: the next step may start
                t_saved = time.time()
                if time.monotonic() - self.saved_at >= self._interval() or self.step >= steps:
                    self._save(batch.batch_id)
                else:
                    self.journal.append(self.step, self.version, batch)
                t_done = time.time()  # the next step may start: the step's own time ends
                times = {"t0": t0, "t1": t1, "t_trained": t_trained,
                         "t_done": t_done if behind is not None else None,
                         "checkpoint_seconds": t_done - t_saved,
                         "steps_left": steps - self.step}
                finish = functools.partial(self._finish, publisher, batch, metrics,
                                           self.step, self.version, weights, times)
                if behind is None:
                    finish()
                else:
                    # the weights are published and the batch acknowledged while the next
                    # step trains (the trainer's thread uses its client only after wait())
                    behind.start(finish)
                # the publish holds the snapshot alone and drops it when done: kept here
                # too, a model's worth (1 GB at 0.5B) lived through the next whole step
                del weights, finish
                t0 = time.time()
        except BaseException:
            if behind is not None:  # the trainer's own error is the one to report
                with contextlib.suppress(BaseException):
                    behind.wait()
            raise
        if behind is not None:
            behind.wait()
        final = self.work_dir / "final" / self.policy
        self.call("save_pretrained", text=str(final))
        log.info("trainer %s: done at version %d; final weights in %s", self.policy,
                 self.version, final)

    def _finish(self, publisher: Any, batch: Any, metrics: dict[str, float], step: int,
                version: int, weights: dict[str, Any], times: dict[str, Any]) -> None:
        """Publish a step's weights, acknowledge its batch and log it.

        ``times``: the step's clock readings (``t0`` its wait began, ``t1`` it trained,
        ``t_trained`` it was trained, ``t_done`` the trainer could start the next step
        while this one publishes, None if it publishes first), its
        ``checkpoint_seconds`` and ``steps_left``. The step's seconds end at ``t_done``: a
        publish behind the next step is not part of the trainer's pace (the data layer
        plans the rollouts it needs with that pace).
        """
        t_published = time.time()
        self._publish(publisher, version, weights)
        t_acked = time.time()
        t0, t1 = times["t0"], times["t1"]
        t_done = times["t_done"] or t_acked
        rewards = [item.trajectory.reward for item in batch.items]
        acked = self.client.ack_batch(
            batch.batch_id, wait_seconds=t1 - t0, step_seconds=t_done - t0,
            steps_left=int(times["steps_left"]),
            metrics={"reward_mean": sum(rewards) / max(len(rewards), 1),
                     **{k: v for k, v in metrics.items()
                        if k in ("loss", "entropy", "grad_norm", "ess_fraction",
                                 "offpolicy_kl")}})
        produced = acked["ledger"]
        staleness = [version - 1 - item.trajectory.min_version for item in batch.items]
        # which rollout pools fed this step (heterogeneous and remote pools show here)
        pools = Counter(str(item.trajectory.metadata.get("pool", "unknown"))
                        for item in batch.items)
        outcomes = [item.trajectory.outcome for item in batch.items]
        self._log({
            **{f"train/{k}": float(v) for k, v in metrics.items()},
            "kind": "train", "policy": self.policy, "step": step,
            "version": version, "time": t_acked, "batch_id": batch.batch_id,
            "reward_mean": sum(rewards) / max(len(rewards), 1),
            "batch_size": len(batch.items), "wait_seconds": t1 - t0,
            "step_seconds": t_done - t1, "staleness_max": max(staleness, default=0),
            "train_seconds": times["t_trained"] - t1,
            "publish_seconds": t_acked - t_published,
            "checkpoint_seconds": times["checkpoint_seconds"],
            # every rollout this policy's nodes produced so far, kept or not
            "generated": produced["generated"],
            # of what the nodes generated and is not still waiting in the buffer
            "trained_fraction": produced["trained_fraction"],
            **{f"pool/{name}": n for name, n in sorted(pools.items())},
            # and, run so far, how many each pool's lag cost (dropped as too stale)
            **{f"dropped_stale/{name}": n for name, n
               in sorted(produced.get("dropped_stale_by_pool", {}).items())},
            # samples whose reward raised or timed out (zero advantage), in this batch
            # and run so far, and the extra metrics a reward returned, batch means
            "reward_failed": sum(o.failed for o in outcomes),
            "reward_failed_total": produced.get("reward_failed", 0),
            # over-provisioned groups: samples cancelled on the nodes, run so far (never
            # trained, not generated trajectories), and this batch's audited groups
            "cancelled_total": produced.get("cancelled", 0),
            **overprovision_metrics(batch.items),
            **reward_metric_means(outcomes),
        })


class _Behind:
    """Publishes a step's weights and acknowledges its batch on a thread of its own while
    the next step trains; one step at a time, in order. An error is raised again in the
    trainer's thread by the next :meth:`wait`."""

    def __init__(self) -> None:
        self.pending: Future | None = None

    def start(self, finish: Any) -> None:
        assert self.pending is None or self.pending.done()
        future: Future[Any] = Future()
        self.pending = future

        def run() -> None:
            try:
                future.set_result(finish())
            except BaseException as exc:
                future.set_exception(exc)

        threading.Thread(target=run, daemon=True, name="publish-behind").start()

    def wait(self) -> None:
        if self.pending is not None:
            future, self.pending = self.pending, None
            future.result()


class _FetchAhead:
    """Fetches the trainer's next batch on a thread of its own (with its own connection)
    while the current one trains. The thread is a daemon: a trainer that stops does not
    wait out a long-poll no step will use."""

    def __init__(self, url: str, token: str, fetch: Any) -> None:
        from astraflow.dataflow.client import DataflowClient

        self.client = DataflowClient(url, token)
        self._fetch = fetch
        self._next: Future | None = None

    @property
    def pending(self) -> bool:
        return self._next is not None

    def start(self, after: str, acknowledged: Future | None = None) -> None:
        """Fetch the batch after ``after`` once ``acknowledged`` (the previous batch's
        acknowledgement, if still on its way) is done."""
        future: Future[Any] = Future()
        self._next = future

        def run() -> None:
            try:
                if acknowledged is not None:
                    with contextlib.suppress(BaseException):  # the trainer raises it
                        acknowledged.result()
                future.set_result(self._fetch(after, self.client))
            except BaseException as exc:  # raised again in the trainer's thread
                future.set_exception(exc)

        threading.Thread(target=run, daemon=True, name="fetch-ahead").start()

    def take(self) -> Any:
        """The batch fetched ahead (None if none came within the long-poll)."""
        assert self._next is not None
        future, self._next = self._next, None
        return future.result()

    def close(self) -> None:
        self.client.close()


class _Heartbeats:
    """Keeps the trainer registered while a long step or a long wait runs."""

    def __init__(self, url: str, token: str, node_id: str, policies: list[str],
                 interval: float = 2.0) -> None:
        from astraflow.dataflow.client import DataflowClient

        self.client = DataflowClient(url, token)
        self.client.register("trainer", policies=policies, node_id=node_id)
        self.node_id, self.interval = node_id, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="heartbeats")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.client.heartbeat(self.node_id)
            except Exception as exc:  # the client retries; a failure here is only logged
                log.warning("heartbeat failed: %r", exc)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.client.close()


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def overprovision_metrics(items: list[Any]) -> dict[str, float]:
    """A batch's over-provisioned groups (see :mod:`astraflow.workflows.groups`): the
    samples cancelled in its groups, and over its audited groups the kept samples' mean
    reward against the cancelled-to-be ones' -- the bias of cutting the tail, where how
    long a sample takes depends on what was written."""
    groups: dict[str, dict[str, Any]] = {}
    for item in items:
        traj = item.trajectory
        groups.setdefault(traj.group_id, traj.metadata)
    cancelled = [int(m["cancelled"]) for m in groups.values() if m.get("cancelled") is not None]
    if not cancelled:
        return {}
    out = {"overprovision/cancelled": float(sum(cancelled))}
    audited = [m for m in groups.values() if "audit_cancelled_reward" in m]
    if audited:
        out["overprovision/audited_groups"] = float(len(audited))
        out["overprovision/kept_reward"] = sum(
            m["audit_kept_reward"] for m in audited) / len(audited)
        out["overprovision/cancelled_reward"] = sum(
            m["audit_cancelled_reward"] for m in audited) / len(audited)
    return out

