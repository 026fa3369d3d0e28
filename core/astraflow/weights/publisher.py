"""The trainer side: turn each exported version into a full snapshot and/or a delta.

The publisher keeps the raw bits it published last, so a delta costs one pass over
the weights and no read-back from the store: in memory, or with ``base_path`` in a file
of the trainer's own, read a tensor at a time (at 0.5B parameters, 1 GB not held).
Publishing never involves nodes: it writes to a store (local directory, or the data
layer over HTTP) and returns.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from astraflow.weights import codec
from astraflow.weights import safetensors_io as st
from astraflow.weights.store import MODEL_FILE, build_version


class PublishTarget(Protocol):
    """Where versions go: a :class:`WeightStore` or an :class:`HttpPublishTarget`."""

    def staging(self, policy: str) -> Path: ...

    def commit(self, policy: str, version: int, staging: Path) -> dict[str, Any]: ...


#: after a refused delta, the next versions are not even encoded as deltas: 1, then 2,
#: 4, ... versions after each refusal in a row, at most this many
MAX_DELTA_SKIP = 8


class WeightPublisher:
    """Publishes one policy's versions; a full snapshot every ``full_every`` versions.

    A delta is dropped in favour of a full snapshot when it would exceed
    ``max_delta_fraction`` of the full size: past that point nodes gain little from it.
    Encoding one is a pass over every weight, so after a refusal the next version is
    published whole without trying, after two in a row the next two, and so on up to
    :data:`MAX_DELTA_SKIP`: a stream whose every step moves most weights (full-weight
    training at a high rate) pays one encoding in that many versions, and one whose
    steps turn sparse is back to deltas within that many.
    A LoRA stream (``adapter``) publishes the adapter's tensors alone, the same way: a
    full adapter or a sparse delta of it, whichever is smaller.
    """

    def __init__(self, target: PublishTarget, policy: str, *, full_every: int = 10,
                 max_delta_fraction: float = 0.5,
                 adapter: Mapping[str, Any] | None = None,
                 base_path: Path | str | None = None) -> None:
        if full_every < 1:
            raise ValueError("full_every must be >= 1")
        self.target = target
        self.policy = policy
        self.full_every = full_every
        self.max_delta_fraction = max_delta_fraction
        #: set for a LoRA stream: every version carries its base's identity and config
        self.adapter = adapter
        #: where the last version's bits are kept (None: in memory)
        self.base_path = Path(base_path) if base_path is not None else None
        self._previous: Mapping[str, st.Tensor] | None = None
        self._previous_version: int | None = None
        self._since_full = 0
        #: versions still to publish whole without trying a delta, and the run of
        #: refusals' current skip
        self._skip = 0
        self._backoff = 0
        #: how many versions were encoded as deltas (tried, worth it or not)
        self.deltas_tried = 0

    def publish(self, version: int, tensors: Mapping[str, st.Tensor], *,
                owned: bool = False) -> dict[str, Any]:
        """Publish ``tensors`` as ``version``; returns the manifest the store accepted.

        ``owned``: the caller never changes ``tensors`` again, so they are kept as the
        next delta's base as they are instead of copied (a model's size less held)."""
        blobs = None
        tried = self._previous is not None and self._skip == 0
        self._skip = max(0, self._skip - 1)
        if tried:
            assert self._previous is not None
            self.deltas_tried += 1
            try:
                blobs = codec.make_delta(self._previous, tensors, self.max_delta_fraction
                                         * sum(t.nbytes for t in tensors.values()))
            except ValueError:
                blobs = None
        full_bytes = sum(t.nbytes for t in tensors.values())
        worth = blobs is not None and (
            sum(len(b) for b in blobs.values()) <= self.max_delta_fraction * full_bytes)
        if tried:
            self._backoff = 0 if worth else min(max(1, 2 * self._backoff), MAX_DELTA_SKIP)
            self._skip = self._backoff
        full = not worth or self._since_full + 1 >= self.full_every
        staging = self.target.staging(self.policy)
        try:
            build_version(staging, self.policy, version, tensors, full=full,
                          delta_base=self._previous_version if worth else None,
                          blobs=blobs if worth else None, adapter=self.adapter)
            manifest = self.target.commit(self.policy, version, staging)
            if self.base_path is not None:
                self._previous = None  # the file it reads is about to be replaced
                self._previous = self._keep(tensors, staging / MODEL_FILE if full else None)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        if self.base_path is None:
            self._previous = (dict(tensors) if owned else
                              {name: st.Tensor(t.dtype, t.shape, t.data.copy())
                               for name, t in tensors.items()})
        self._previous_version = version
        self._since_full = 0 if full else self._since_full + 1
        return manifest

    def _keep(self, tensors: Mapping[str, st.Tensor], written: Path | None) -> st.OnDisk:
        """The version's bits in ``base_path``: the full snapshot just staged, moved there,
        or written anew after a delta."""
        assert self.base_path is not None
        self.base_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            if written is None:
                raise OSError("no full snapshot staged")
            os.replace(written, self.base_path)
        except OSError:  # another file system, or a delta alone was staged
            st.save(self.base_path, tensors)
        return st.OnDisk(self.base_path)
