"""The trainer runtime: pull a batch -> train step -> publish weights -> acknowledge.

To a trainer, AstraFlow is a streaming corpus plus a weight publication target. The
runtime is the loop alone; its collaborators each own their part:
:class:`~astraflow.trainer.source.BatchSource` (batches, fetched ahead, acknowledged),
:class:`~astraflow.trainer.publish.StepPublisher` (the weight stream, published behind
the next step), :class:`~astraflow.trainer.checkpoint.Checkpointer` (checkpoints and
the journal a killed trainer resumes from) and
:class:`~astraflow.trainer.report.StepReport` (the metrics). The backend is called
through its contract (:class:`~astraflow.contracts.trainer.TrainerBackend`).

A trainer of several ranks (``trainer.world_size`` > 1, started by ``torchrun``) runs
this loop on rank 0 alone; the other ranks follow it (:mod:`astraflow.trainer.ranks`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from pathlib import Path
from typing import Any

from astraflow.contracts.trainer import TrainerBackend
from astraflow.errors import ConfigError
from astraflow.lifecycle import mark_ready
from astraflow.plugins import get_registry
from astraflow.trainer import distributed
from astraflow.trainer.checkpoint import Checkpointer, Progress
from astraflow.trainer.publish import StepPublisher, adapter_of
from astraflow.trainer.ranks import Leader, Ranks
from astraflow.trainer.report import StepReport, StepTimes, dashboard_metrics
from astraflow.trainer.settings import TrainerSettings, settings_from_config
from astraflow.trainer.source import BatchSource, Heartbeats
from astraflow.types import Batch

log = logging.getLogger("astraflow.trainer")


class TrainerRuntime:
    """One policy's trainer, from a run config (``cfg``) or its typed section."""

    def __init__(self, cfg: Any, url: str, token: str, policy: str, work_dir: str,
                 metrics_path: str | None = None) -> None:
        self.settings: TrainerSettings = (cfg if isinstance(cfg, TrainerSettings)
                                          else settings_from_config(cfg, policy))
        self.policy = policy
        self.url, self.token = url, token
        self.work_dir = Path(work_dir)
        s = self.settings
        self.source = BatchSource(url, token, policy, s.batch_size, s.trainer_id,
                                  s.fetch_ahead)
        #: the trainer's own connection (fetches, acknowledgements, leaving)
        self.client = self.source.client
        self.checkpoints = Checkpointer(self.work_dir, policy, s.checkpoint_interval)
        self.report = StepReport(Path(metrics_path or self.work_dir / f"metrics-{policy}.jsonl"),
                                 policy, s.record_batches)
        self.progress = Progress()

    def _build(self) -> TrainerBackend:
        """The backend the settings name, built with this policy's section."""
        entry = get_registry().get("trainer_backend", self.settings.backend)
        backend: TrainerBackend = entry.create(self.settings.backend_config,
                                               self.settings.model_path)
        return backend

    def _publisher(self, backend: Leader) -> StepPublisher:
        from astraflow.weights.client import HttpPublishTarget
        from astraflow.weights.publisher import WeightPublisher

        # the last version's bits, the next delta's base, wait on disk: not in memory
        # on the data layer's machine, versions are put into its store's directory
        weights = WeightPublisher(
            HttpPublishTarget(self.url, self.token, local_writes=True), self.policy,
            adapter=adapter_of(backend, self.settings.model_path),
            base_path=self.work_dir / "trainer-weights" / f"{self.policy}.delta-base.safetensors")
        return StepPublisher(weights, self.settings.overlap_publish)

    def _ranks(self) -> Ranks | None:
        """This process's place among the trainer's ranks (None: it is alone)."""
        if not distributed():
            return None
        from astraflow.rl.options import parallel_sizes
        from astraflow.trainer.ranks import init

        ranks = init(self.settings.collective_timeout)
        parallel_sizes(self.settings.backend_config)
        if ranks.world_size != self.settings.world_size:
            raise ConfigError(f"torchrun started {ranks.world_size} ranks but "
                              f"trainer.world_size={self.settings.world_size}")
        return ranks

    def run(self, steps: int | None = None) -> None:
        steps = self.settings.steps if steps is None else steps
        ranks = self._ranks()
        backend = self._build()
        if ranks is not None and not ranks.leader:
            from astraflow.trainer.ranks import follow

            follow(backend, ranks)
            return
        leader = Leader(backend, ranks)
        publisher = self._publisher(leader)
        self._start_stream(leader, publisher, self.checkpoints.resume(leader, self.progress))
        beats = Heartbeats(self.url, self.token, self.settings.trainer_id, [self.policy])
        mark_ready()
        try:
            self._train(leader, publisher, steps)
            leader.stop()
        finally:
            beats.stop()
            self.source.close()
        # leaving tells the data layer no one consumes this policy any more, so it stops
        # holding the other policies back for it
        self.client.leave(self.settings.trainer_id)

    def _start_stream(self, leader: Leader, publisher: StepPublisher, resumed: bool) -> None:
        """Publish what this trainer holds, unless the stream has it already: the stream
        never goes backwards."""
        from astraflow.weights.client import WeightClient

        with WeightClient(self.url, self.token, self.work_dir / "trainer-weights") as wc:
            latest = wc.latest(self.policy)
        if latest is not None and latest == self.progress.version and resumed:
            return
        if latest is not None:
            self.progress.version = max(latest, self.progress.version) + 1
        publisher.publish(self.progress.version, leader.export_weights())

    def _train(self, leader: Leader, publisher: StepPublisher, steps: int) -> None:
        log.info("trainer %s: starting at step %d, version %d", self.policy,
                 self.progress.step, self.progress.version)
        waited = time.time()  # waiting starts when the previous step ended, across polls
        try:
            while self.progress.step < steps:
                batch = self.source.take(publisher.wait)
                if batch is None:
                    leader.idle()  # the other ranks wait for rank 0's next call
                    continue
                if batch.batch_id == self.progress.trained_batch:
                    self.source.ack_trained(batch)
                    self.progress.trained_batch = None
                else:
                    if self.progress.step + 1 < steps:
                        # the next batch is composed and sent while this one trains (for
                        # the version it will be trained at); asked for once the previous
                        # one is acknowledged, so a trainer holds two batches at most
                        self.source.fetch_ahead(batch.batch_id, publisher.pending)
                    self._step(leader, publisher, batch, StepTimes(waited), steps)
                waited = time.time()
        except BaseException:
            with contextlib.suppress(BaseException):  # the trainer's own error is reported
                publisher.wait()
            raise
        publisher.wait()
        final = self.work_dir / "final" / self.policy
        leader.save_pretrained(str(final))
        log.info("trainer %s: done at version %d; final weights in %s", self.policy,
                 self.progress.version, final)

    def _step(self, leader: Leader, publisher: StepPublisher, batch: Batch, times: StepTimes,
              steps: int) -> None:
        """Train on ``batch``, keep it (checkpoint or journal), then publish the step's
        weights and acknowledge it, behind the next step or before it."""
        progress = self.progress
        times.started = time.time()
        self.report.batch(progress.step + 1, batch)
        metrics = leader.train_step(batch)
        progress.version += 1
        progress.step += 1
        times.trained = time.time()
        # one step's publish at a time, in order; waited for before the snapshot, so at
        # most two are held (the last published, this one)
        publisher.wait()
        snapshot = leader.export_weights()  # the next step may start
        saved = time.time()
        self.checkpoints.record(leader, progress, batch, last=progress.step >= steps)
        now = time.time()
        times.done = now if publisher.overlap else None
        times.checkpoint_seconds, times.steps_left = now - saved, steps - progress.step
        publisher.after_step(functools.partial(
            self._finish, publisher, batch, metrics, progress.step, progress.version,
            snapshot, times))
        # the publish holds the snapshot alone and drops it when done: kept here too, a
        # model's worth (1 GB at 0.5B) would live through the next whole step
        del snapshot

    def _finish(self, publisher: StepPublisher, batch: Batch, metrics: dict[str, float],
                step: int, version: int, snapshot: dict[str, Any], times: StepTimes) -> None:
        """Publish a step's weights, acknowledge its batch and log it."""
        published = time.time()
        publisher.publish(version, snapshot)
        del snapshot
        acked = time.time()
        ledger = self.source.ack(
            batch, wait_seconds=times.wait_seconds,
            step_seconds=(times.done or acked) - times.waited, steps_left=times.steps_left,
            metrics=dashboard_metrics(batch, metrics))
        self.report.step(step=step, version=version, batch=batch, metrics=metrics,
                         times=times, published=published, acked=acked, ledger=ledger)
