"""The wire format shared by the service and its clients: typed payloads, never pickle.

Requests and responses are JSON or msgpack (``Content-Type``/``Accept:
application/msgpack``). On the hot paths token arrays may travel as little-endian
binary blobs (tokens and versions int32, log-probs float32, loss mask uint8), which
is also how the store keeps them; JSON clients send plain lists.
"""

from __future__ import annotations

import bisect
import itertools
import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NoReturn

import msgpack
import numpy as np
from pydantic import BaseModel, ConfigDict, Field, JsonValue, StrictBytes, ValidationError

from astraflow.types import (
    NOT_ROUTED,
    Batch,
    RewardOutcome,
    RoutedExperts,
    Span,
    Task,
    TrainItem,
    Trajectory,
)

MSGPACK = "application/msgpack"
JSON = "application/json"
#: wire dtypes of the binary token arrays
DTYPES: dict[str, np.dtype] = {
    "tokens": np.dtype("<i4"),
    "logprobs": np.dtype("<f4"),
    "loss_mask": np.dtype("u1"),
    "versions": np.dtype("<i4"),
}
ARRAYS = tuple(DTYPES)
TOKEN_LIMIT = 2**31

Name = Annotated[str, Field(min_length=1, max_length=256)]
NodeId = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")]


class PayloadError(ValueError):
    """A request body that cannot be used; ``status`` is the HTTP status to answer."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Labels(_Model):
    """What a node offers; ``pool`` groups nodes for the autoscale report."""

    pool: Name = "default"
    region: Name = "local"
    policies: list[Name] = Field(default_factory=list, max_length=256)
    capacity: int = Field(default=1, ge=0, le=1_000_000)


class RegisterIn(_Model):
    kind: Literal["raas", "trainer"]
    node_id: NodeId | None = None
    labels: Labels = Field(default_factory=Labels)


class LeaseIn(_Model):
    node_id: NodeId
    max_tasks: int = Field(default=1, ge=1, le=1024)
    wait: float = Field(default=0.0, ge=0.0, le=300.0)
    #: weight version the node holds per policy (admission control); default: latest
    versions: dict[Name, Annotated[int, Field(ge=0)]] = Field(default_factory=dict)


class TaskIn(_Model):
    task_id: Name
    prompt: str = Field(max_length=1_000_000)
    answer: str | None = None
    task_type: Name = "default"
    metadata: dict[str, JsonValue] = Field(default_factory=dict)


class TasksIn(_Model):
    tasks: list[TaskIn] = Field(min_length=1, max_length=100_000)


class SpanIn(_Model):
    start: int = Field(ge=0)
    end: int = Field(ge=0)
    source: Name
    version: int = Field(default=-1, ge=-1)


IntArray = list[int] | StrictBytes
FloatArray = list[float] | StrictBytes


class OutcomeIn(_Model):
    """How a trajectory's reward went (``Trajectory.outcome``)."""

    failed: bool = False
    reason: str | None = Field(default=None, max_length=65_536)
    metrics: dict[Name, float] = Field(default_factory=dict, max_length=256)


class RoutedExpertsIn(_Model):
    """The experts each MoE layer routed each token to (router replay): ``experts`` is
    ``[tokens, layers, top_k]`` as a binary blob (uint8, or little-endian uint16 when
    ``wide``; msgpack) or a list (JSON), 255 (65535) where nobody routed the token."""

    layers: int = Field(ge=1, le=1024)
    top_k: int = Field(ge=1, le=256)
    experts: IntArray
    wide: bool = False


class TrajectoryIn(_Model):
    """A trajectory on the wire: arrays as lists (JSON) or binary blobs (msgpack)."""

    task_id: Name
    group_id: Name
    policy: Name
    tokens: IntArray
    logprobs: FloatArray
    loss_mask: IntArray
    versions: IntArray
    spans: list[SpanIn] = Field(min_length=1)
    reward: float
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    #: absent: the reward did not fail and returned no extra metrics, unless the
    #: metadata tells otherwise the way it did before 1.2
    outcome: OutcomeIn | None = None
    #: with router replay: the experts the engine routed each token to
    routed_experts: RoutedExpertsIn | None = None


class MoreLeases(_Model):
    """Tasks to lease in the same round trip as a submission (never waits)."""

    max_tasks: int = Field(default=1, ge=1, le=1024)
    #: weight version the node holds per policy (admission control); default: latest
    versions: dict[Name, Annotated[int, Field(ge=0)]] = Field(default_factory=dict)


class SubmitIn(_Model):
    lease_id: Name
    node_id: NodeId | None = None
    trajectories: list[TrajectoryIn] = Field(min_length=1, max_length=65_536)
    #: lease more tasks for ``node_id`` once the trajectories are accepted
    lease: MoreLeases | None = None


class SubmitManyIn(_Model):
    """Several tasks' submissions in one request (a busy node's, gathered while its
    previous request was in flight): each is handled as its own ``/v1/trajectories``."""

    submissions: list[SubmitIn] = Field(min_length=1, max_length=1024)


class BatchIn(_Model):
    policy: Name
    n: int = Field(ge=1, le=65_536)
    timeout: float = Field(default=30.0, ge=0.0, le=300.0)
    #: stable per trainer (e.g. policy + rank): an unacknowledged batch is served to it again
    trainer_id: NodeId = "trainer"
    #: the unacknowledged batch the trainer holds: serve the one after it (fetch ahead)
    after: str | None = Field(default=None, min_length=1, max_length=64,
                              pattern=r"^[0-9a-f]+$")


#: a reported number: finite (JSON has no NaN), a metric name as key
Metrics = Annotated[dict[Name, Annotated[float, Field(allow_inf_nan=False)]],
                    Field(max_length=64)]


class AckIn(_Model):
    """``step_seconds`` is the step's whole wall time, ``wait_seconds`` the part spent
    waiting; ``metrics`` the step's numbers the dashboard draws (reward_mean, loss);
    ``steps_left`` the steps the trainer has still to take (none: it does not say), so
    admission stops issuing tasks once what is queued covers them."""

    wait_seconds: float = Field(default=0.0, ge=0.0, le=1e7)
    step_seconds: float = Field(default=0.0, ge=0.0, le=1e7)
    metrics: Metrics = Field(default_factory=dict)
    steps_left: int | None = Field(default=None, ge=0, le=1 << 40)


class EvalIn(_Model):
    """An evaluator's held-out scores of ``policy`` at ``version``."""

    policy: Name
    version: int = Field(ge=0, le=2**62)
    metrics: Metrics = Field(min_length=1)


class VersionIn(_Model):
    policy: Name
    version: int = Field(ge=0, le=2**62)


class VersionsWaitIn(_Model):
    #: the version a node holds (or has last seen announced) per policy it follows
    have: dict[Name, Annotated[int, Field(ge=0)]] = Field(min_length=1, max_length=64)
    wait: float = Field(default=0.0, ge=0.0, le=300.0)


REQUEST_MODELS: tuple[type[BaseModel], ...] = (
    RegisterIn,
    LeaseIn,
    TasksIn,
    SubmitIn,
    SubmitManyIn,
    BatchIn,
    AckIn,
    EvalIn,
    VersionIn,
    VersionsWaitIn,
)


def decode_body(body: bytes, content_type: str) -> Any:
    """Parse a request body by its content type (JSON if none is given)."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media in (MSGPACK, "application/x-msgpack"):
        try:
            return msgpack.unpackb(body, raw=False, strict_map_key=True)
        except Exception as exc:
            raise PayloadError(f"body is not valid msgpack: {exc}", 400) from None
    if media in ("", JSON) or media.endswith("+json"):
        try:
            return json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise PayloadError(f"body is not valid JSON: {exc}", 400) from None
    raise PayloadError(f"unsupported content type {media!r}: send {JSON} or {MSGPACK}", 415)


def validation_message(exc: ValidationError, limit: int = 5) -> str:
    """One readable line per problem: where it is and what is wrong (never the input)."""
    parts = []
    for err in exc.errors(include_input=False, include_url=False)[:limit]:
        loc = ".".join(str(p) for p in err["loc"]) or "body"
        parts.append(f"{loc}: {err['msg']}")
    more = exc.error_count() - limit
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def parse(model: type[BaseModel], data: Any) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise PayloadError(validation_message(exc)) from None
    except RecursionError:
        raise PayloadError("payload is nested too deeply", 400) from None


#: inclusive bounds of the integer arrays (int32 blobs cannot exceed the upper ones)
BOUNDS: dict[str, tuple[int, int]] = {
    "tokens": (0, TOKEN_LIMIT - 1),
    "loss_mask": (0, 1),
    "versions": (-1, TOKEN_LIMIT - 1),
}
#: above every version: stands in for "no trained token" in a trajectory's minimum version
UNTRAINED = np.int64(TOKEN_LIMIT)
BOUND_RULES = {
    "tokens": "token ids must be in [0, 2**31)",
    "loss_mask": "entries must be 0 or 1",
    "versions": "entries must be in [-1, 2**31)",
}


def _blob(name: str, value: list[Any] | bytes) -> bytes:
    """One array in its wire form; a JSON list is range-checked before it is narrowed."""
    dtype = DTYPES[name]
    if isinstance(value, bytes):
        if len(value) % dtype.itemsize:
            raise PayloadError(
                f"{name}: binary length {len(value)} is not a multiple of {dtype.itemsize} "
                f"({dtype.name} little-endian)"
            )
        return value
    if name == "logprobs":
        return np.asarray(value, dtype=np.float64).astype(dtype).tobytes()
    try:
        arr = np.asarray(value, dtype=np.int64)
    except OverflowError:
        raise PayloadError(f"{name}: integer out of range") from None
    low, high = BOUNDS[name]
    if arr.size and (arr.min() < low or arr.max() > high):
        raise PayloadError(f"{name}: {BOUND_RULES[name]}")
    return arr.astype(dtype).tobytes()


@dataclass(slots=True)
class CheckedTrajectory:
    """A validated trajectory with its arrays as little-endian blobs (the stored form)."""

    task_id: str
    group_id: str
    policy: str
    blobs: dict[str, bytes]
    spans: list[dict[str, Any]]
    reward: float
    metadata: dict[str, Any]
    outcome: RewardOutcome
    min_version: int
    routed_experts: RoutedExperts | None = None

    def record(self, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
        """The trajectory in its one encoded form (:func:`record`)."""
        return record(self.task_id, self.group_id, self.policy, self.blobs, self.spans,
                      self.reward, self.metadata if metadata is None else metadata,
                      self.outcome, self.routed_experts)

    def payload(self, advantage: float, metadata: dict[str, Any]) -> bytes:
        """The stored (and served) form: the record, with its advantage, as msgpack."""
        packed: bytes = msgpack.packb({**self.record(metadata), "advantage": advantage})
        return packed

    def to_trajectory(self) -> Trajectory:
        return decode_trajectory(self.record(dict(self.metadata)))


def check_trajectories(trajectories: list[TrajectoryIn]) -> list[CheckedTrajectory]:
    """Everything ``Trajectory.validate`` checks, plus the rules routing relies on.

    A trained token (loss mask 1) must lie in a span generated by the trajectory's own
    policy and carry the weight version that produced it: that is what keeps one
    policy's tokens out of another policy's loss and makes staleness measurable.

    The element-wise rules run once over the submission's arrays laid end to end, as
    reductions that allocate nothing (a handful of numpy calls per request, not per
    trajectory); only a failing rule looks for the element, to name its trajectory.
    """
    blobs, lengths = _arrays(trajectories)
    offsets = list(itertools.accumulate(lengths, initial=0))
    tokens, logprobs, mask, versions = (
        np.frombuffer(b"".join(w[name] for w in blobs), DTYPES[name]) for name in ARRAYS
    )

    def fail(bad: np.ndarray, message: str) -> NoReturn:
        i = bisect.bisect_right(offsets, int(bad.argmax())) - 1
        raise PayloadError(f"trajectories.{i}.{message}")

    if tokens.size:
        if tokens.min() < 0:
            fail(tokens < 0, f"tokens: {BOUND_RULES['tokens']}")
        if mask.max() > 1:
            fail(mask > 1, f"loss_mask: {BOUND_RULES['loss_mask']}")
        if versions.min() < -1:
            fail(versions < -1, f"versions: {BOUND_RULES['versions']}")
    trained = mask.view(bool)
    if not np.isfinite(logprobs).all():
        bad = trained & ~np.isfinite(logprobs)
        if bad.any():
            fail(bad, "logprobs: trained tokens need finite log-probs")
    spans = [_tiled(i, t, trained[offsets[i]:offsets[i] + lengths[i]])
             for i, t in enumerate(trajectories)]
    min_versions = _min_versions(trained, versions, offsets, lengths)
    return [
        CheckedTrajectory(t.task_id, t.group_id, t.policy, wire, tiled, float(t.reward),
                          t.metadata, _outcome(t), low,
                          None if t.routed_experts is None
                          else _routed(i, t.routed_experts, n))
        for i, (t, wire, tiled, low, n) in enumerate(zip(
            trajectories, blobs, spans, min_versions, lengths, strict=True))
    ]


def _routed(i: int, routed: RoutedExpertsIn, tokens: int) -> RoutedExperts:
    """Trajectory ``i``'s routed experts in their stored form: one entry per token,
    layer and choice."""
    width = 2 if routed.wide else 1
    want = tokens * routed.layers * routed.top_k
    where = f"trajectories.{i}.routed_experts.experts"
    if isinstance(routed.experts, bytes):
        if len(routed.experts) != want * width:
            raise PayloadError(f"{where}: {len(routed.experts)} bytes, expected {tokens} "
                               f"tokens x {routed.layers} layers x {routed.top_k} x {width}")
        return RoutedExperts(routed.layers, routed.top_k, routed.experts, routed.wide)
    if len(routed.experts) != want:
        raise PayloadError(f"{where}: {len(routed.experts)} entries, expected {tokens} tokens "
                           f"x {routed.layers} layers x {routed.top_k}")
    arr = np.asarray(routed.experts, dtype=np.int64)
    if arr.size and (arr.min() < 0 or arr.max() > NOT_ROUTED[routed.wide]):
        raise PayloadError(f"{where}: entries must be in [0, {NOT_ROUTED[routed.wide]}]")
    dtype = np.dtype("<u2" if routed.wide else "u1")
    return RoutedExperts(routed.layers, routed.top_k, arr.astype(dtype).tobytes(), routed.wide)


def _outcome(t: TrajectoryIn) -> RewardOutcome:
    if t.outcome is not None:
        return RewardOutcome(t.outcome.failed, t.outcome.reason, dict(t.outcome.metrics))
    return RewardOutcome.from_metadata(t.metadata) or RewardOutcome()


def _arrays(trajectories: list[TrajectoryIn]) -> tuple[list[dict[str, bytes]], list[int]]:
    """Each trajectory's arrays in their wire form, and its length (all arrays alike)."""
    blobs: list[dict[str, bytes]] = []
    lengths: list[int] = []
    for i, t in enumerate(trajectories):
        try:
            wire = {name: _blob(name, getattr(t, name)) for name in ARRAYS}
        except PayloadError as exc:
            raise PayloadError(f"trajectories.{i}.{exc}") from None
        n = len(wire["tokens"]) // 4
        for name in ARRAYS[1:]:
            entries = len(wire[name]) // DTYPES[name].itemsize
            if entries != n:
                raise PayloadError(
                    f"trajectories.{i}: {name} has {entries} entries, tokens has {n}"
                )
        blobs.append(wire)
        lengths.append(n)
    return blobs, lengths


def _tiled(i: int, t: TrajectoryIn, trained: np.ndarray) -> list[dict[str, Any]]:
    """Trajectory ``i``'s spans, checked to tile its tokens and to hold trained tokens
    only where the trajectory's own policy generated them."""
    pos, n = 0, len(trained)
    tiled = []
    for j, span in enumerate(t.spans):
        start, end = span.start, span.end
        if start != pos or end < start:
            raise PayloadError(
                f"trajectories.{i}.spans.{j}: spans must tile the tokens contiguously "
                f"(expected start {pos}, got {start}..{end})"
            )
        if span.source != t.policy and trained[min(start, n):min(end, n)].any():
            raise PayloadError(
                f"trajectories.{i}.loss_mask: marks tokens of span {j} (source "
                f"{span.source!r}) in a {t.policy!r} trajectory; only the policy's own "
                "tokens may be trained"
            )
        tiled.append({"start": start, "end": end, "source": span.source,
                      "version": span.version})
        pos = end
    if pos != n:
        raise PayloadError(f"trajectories.{i}.spans: cover {pos} tokens, tokens has {n}")
    return tiled


def _min_versions(trained: np.ndarray, versions: np.ndarray, offsets: list[int],
                  lengths: list[int]) -> list[int]:
    """Per trajectory, the oldest weight version among its trained tokens (-1: none)."""
    starts = [offsets[i] for i, n in enumerate(lengths) if n]
    lowest = iter(
        np.minimum.reduceat(np.where(trained, versions, UNTRAINED), starts).tolist()
        if starts else ()
    )
    out = []
    for i, n in enumerate(lengths):
        low = next(lowest) if n else UNTRAINED
        if low < 0:
            raise PayloadError(
                f"trajectories.{i}.versions: trained tokens need the weight version (>= 0)"
            )
        out.append(-1 if low == UNTRAINED else int(low))
    return out


# ---- client-side helpers -------------------------------------------------------------


@dataclass
class Lease:
    """A task leased to a node until ``deadline`` (unix time); submit with ``lease_id``."""

    lease_id: str
    task: Task
    group_size: int
    deadline: float
    versions: dict[str, int]

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Lease:
        return cls(
            data["lease_id"], Task(**data["task"]), data["group_size"], data["deadline"],
            data["versions"],
        )


# ---- the codec: one encoded form of a trajectory, from the node to the trainer ---------


def record(task_id: str, group_id: str, policy: str, arrays: dict[str, bytes],
           spans: list[dict[str, Any]], reward: float, metadata: dict[str, Any],
           outcome: RewardOutcome, routed: RoutedExperts | None = None) -> dict[str, Any]:
    """A trajectory as the node submits it, the data layer stores and serves it and the
    trainer reads it: a map with its token arrays as little-endian binary blobs. The
    outcome goes only when it says something (a stored payload of 1.1 has none)."""
    out = {"task_id": task_id, "group_id": group_id, "policy": policy, **arrays,
           "spans": spans, "reward": reward, "metadata": metadata}
    if outcome.failed or outcome.reason is not None or outcome.metrics:
        out["outcome"] = {"failed": outcome.failed, "reason": outcome.reason,
                          "metrics": outcome.metrics}
    if routed is not None:  # router replay only
        out["routed_experts"] = {"layers": routed.layers, "top_k": routed.top_k,
                                 "experts": routed.experts, "wide": routed.wide}
    return out


def encode_trajectory(t: Trajectory) -> dict[str, Any]:
    """``t`` in its encoded form (:func:`record`), for msgpack."""
    return record(
        t.task_id, t.group_id, t.policy,
        {k: np.asarray(getattr(t, k), dtype=DTYPES[k]).tobytes() for k in ARRAYS},
        [{"start": s.start, "end": s.end, "source": s.source, "version": s.version}
         for s in t.spans],
        t.reward, t.metadata, t.outcome, t.routed_experts)


def decode_trajectory(data: dict[str, Any]) -> Trajectory:
    """A trajectory from its encoded form (arrays as blobs, or lists from JSON)."""
    arrays = {
        k: np.frombuffer(v, DTYPES[k]).tolist() if isinstance(v, bytes) else list(v)
        for k, v in ((k, data[k]) for k in ARRAYS)
    }
    outcome = data.get("outcome")
    routed = data.get("routed_experts")
    if routed is not None and not isinstance(routed["experts"], bytes):  # from JSON
        dtype = np.dtype("<u2" if routed.get("wide") else "u1")
        routed = {**routed, "experts": np.asarray(routed["experts"], dtype).tobytes()}
    return Trajectory(
        task_id=data["task_id"],
        group_id=data["group_id"],
        policy=data["policy"],
        **arrays,
        spans=[Span(**s) for s in data["spans"]],
        reward=data["reward"],
        metadata=data["metadata"],
        outcome=RewardOutcome(**outcome) if outcome else RewardOutcome(),
        routed_experts=RoutedExperts(**routed) if routed else None,
    )


def reward_failed(data: dict[str, Any]) -> bool:
    """Whether the reward of a trajectory in its encoded form failed."""
    outcome = data.get("outcome")
    if outcome:
        return bool(outcome.get("failed"))
    legacy = RewardOutcome.from_metadata(data.get("metadata") or {})
    return legacy is not None and legacy.failed


def jsonable_item(data: dict[str, Any]) -> dict[str, Any]:
    """A stored trajectory payload with its binary arrays as lists (for JSON replies)."""
    out = {
        k: np.frombuffer(v, DTYPES[k]).tolist() if k in DTYPES else v for k, v in data.items()
    }
    routed = out.get("routed_experts")
    if routed is not None and isinstance(routed.get("experts"), bytes):
        dtype = np.dtype("<u2" if routed.get("wide") else "u1")
        out["routed_experts"] = {**routed,
                                 "experts": np.frombuffer(routed["experts"], dtype).tolist()}
    return out


def batch_to_wire(batch: Batch) -> dict[str, Any]:
    """A batch as :func:`batch_from_wire` reads it (msgpack, arrays as binary)."""
    return {"batch_id": batch.batch_id, "policy": batch.policy,
            "items": [{**encode_trajectory(item.trajectory), "advantage": item.advantage}
                      for item in batch.items],
            "trainer_version": batch.trainer_version, "metadata": batch.metadata}


def batch_from_wire(data: dict[str, Any]) -> Batch:
    items = []
    for raw in data["items"]:
        advantage = raw.pop("advantage")
        items.append(TrainItem(decode_trajectory(raw), advantage))
    return Batch(data["batch_id"], data["policy"], items, data["trainer_version"], data["metadata"])
