"""The wire format shared by the service and its clients: typed payloads, never pickle.

Requests and responses are JSON or msgpack (``Content-Type``/``Accept:
application/msgpack``). On the hot paths token arrays may travel as little-endian
binary blobs (tokens and versions int32, log-probs float32, loss mask uint8), which
is also how the store keeps them; JSON clients send plain lists. What a submission's
trajectories must satisfy beyond their types is checked in :mod:`.checks`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgpack
import numpy as np
from pydantic import BaseModel, ConfigDict, Field, JsonValue, StrictBytes, ValidationError

from astraflow.types import (
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
