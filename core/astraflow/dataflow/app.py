"""The data layer's HTTP API (FastAPI): every route authenticated, every body typed.

Bodies are decoded here rather than by FastAPI so that JSON and msgpack share one
validation path and every malformed request gets a 4xx naming what is wrong (never
the offending bytes). /openapi.json is generated from the same pydantic models.
"""

from __future__ import annotations

import importlib.util
import json
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any

import msgpack
from fastapi import APIRouter, Depends, FastAPI, Header, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel

from astraflow.dataflow.dashboard import dashboard_router
from astraflow.dataflow.hotpath import HotRoutes, encode, refusal
from astraflow.dataflow.records import BatchRec, ServiceError
from astraflow.dataflow.service import DataflowService
from astraflow.dataflow.settings import DataflowSettings
from astraflow.dataflow.wire import (
    JSON,
    MSGPACK,
    REQUEST_MODELS,
    AckIn,
    BatchIn,
    EvalIn,
    LeaseIn,
    PayloadError,
    RegisterIn,
    SubmitIn,
    SubmitManyIn,
    TasksIn,
    VersionIn,
    VersionsWaitIn,
    decode_body,
    jsonable_item,
    parse,
)
from astraflow.plugins import Registry
from astraflow.security import BodySizeLimit, bearer_auth

NODE_ID = Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")
BATCH_ID = Path(min_length=1, max_length=64, pattern=r"^[0-9a-f]+$")


def _body_doc(model: type[BaseModel]) -> dict[str, Any]:
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {
        "requestBody": {
            "required": True,
            "content": {JSON: {"schema": ref}, MSGPACK: {"schema": ref}},
        }
    }


async def _read(request: Request, model: type[BaseModel]) -> Any:
    raw = await request.body()
    data = decode_body(raw, request.headers.get("content-type", "")) if raw else {}
    return parse(model, data)


def _reply(request: Request, data: Any, status: int = 200) -> Response:
    body, media = encode(data, MSGPACK in request.headers.get("accept", ""))
    return Response(body, status_code=status, media_type=media)


def _batch_reply(request: Request, rec: BatchRec, payloads: dict[int, bytes],
                 redelivered: bool) -> Response:
    """The batch; stored msgpack payloads are spliced in as they are (no re-encoding)."""
    head = {
        "batch_id": rec.batch_id,
        "policy": rec.policy,
        "trainer_version": rec.trainer_version,
        "metadata": {
            "redelivered": redelivered,
            "replayed": len(rec.replay),
            "trainer_id": rec.trainer_id,
            "created_at": rec.created_at,
        },
    }
    items = [payloads[i] for i in rec.items + rec.replay if i in payloads]
    if MSGPACK not in request.headers.get("accept", ""):
        head["items"] = [jsonable_item(msgpack.unpackb(p)) for p in items]
        return Response(json.dumps(head), media_type=JSON)
    packer = msgpack.Packer()
    parts = [packer.pack_map_header(len(head) + 1)]
    for key, value in head.items():
        parts += [packer.pack(key), packer.pack(value)]
    parts += [packer.pack("items"), packer.pack_array_header(len(items)), *items]
    return Response(b"".join(parts), media_type=MSGPACK)


def _weights_router(settings: DataflowSettings, service: DataflowService,
                    auth: Callable[..., Any]) -> APIRouter | None:
    """The weight store's routes (when installed) over ``<store>/weights``.

    A committed version is announced to the service, so batches and admission control
    see it without the trainer announcing it separately. Uploads come in chunks that fit
    ``max_body_bytes``, the limit every request keeps.
    """
    if importlib.util.find_spec("astraflow.weights.http") is None:
        return None
    from astraflow.weights.http import weights_router
    from astraflow.weights.store import WeightStore

    store = WeightStore(settings.store_path / "weights")
    return weights_router(store, auth, service.announce_version,
                          max_body_bytes=settings.max_body_bytes)


def create_app(settings: DataflowSettings, token: str,
               extra_routers: Iterable[APIRouter] = (), registry: Registry | None = None
               ) -> FastAPI:
    """The data layer as an ASGI app; ``app.state.service`` is its :class:`DataflowService`.

    ``registry`` picks the plugins' implementations (default: the installed plugins).
    """
    service = DataflowService(settings, registry)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            await service.stop()

    app = FastAPI(
        title="AstraFlow data layer",
        version="1",
        description="Task leasing, trajectory buffers and batch serving. Bodies are JSON or "
        "msgpack; every route needs `Authorization: Bearer <token>`.",
        lifespan=lifespan,
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    app.state.service = service
    if settings.hot_routes:  # inside the size limit, which stays the outermost
        app.add_middleware(HotRoutes, service=service, token=token)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    check_token = bearer_auth(token)

    async def authenticated(authorization: str | None = Header(default=None)) -> None:
        """The shared bearer check, run inline: a sync dependency would cost a thread hop."""
        check_token(authorization)

    r = APIRouter(dependencies=[Depends(authenticated)])
    for add_routes in (_node_routes, _trajectory_routes, _batch_routes, _version_routes,
                       _report_routes):
        add_routes(r, service)
    if settings.bench_echo:
        _echo_route(r)

    @r.get("/openapi.json", include_in_schema=False)
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    app.include_router(r)
    app.include_router(dashboard_router(service, token))
    weights = _weights_router(settings, service, check_token)
    if weights is not None:
        app.include_router(weights)
    for router in extra_routers:
        app.include_router(router)
    app.openapi = _openapi_builder(app)  # type: ignore[method-assign]
    _error_handlers(app, settings)
    return app


def _node_routes(r: APIRouter, service: DataflowService) -> None:
    @r.get("/v1/health")
    async def health() -> dict[str, Any]:
        """Liveness: the service answers and its store is open."""
        return {"ok": True}

    @r.post("/v1/nodes", openapi_extra=_body_doc(RegisterIn))
    async def register(request: Request) -> Response:
        """Register (or re-register) a RaaS node or trainer with its labels."""
        return _reply(request, await service.register(await _read(request, RegisterIn)))

    @r.post("/v1/nodes/{node_id}/heartbeat")
    async def heartbeat(request: Request, node_id: str = NODE_ID) -> Response:
        """Keep a node alive; 404 means it was retired and must register again."""
        return _reply(request, service.heartbeat(node_id))

    @r.delete("/v1/nodes/{node_id}")
    async def leave(request: Request, node_id: str = NODE_ID) -> Response:
        """Leave cleanly: the node's leases are re-issued at once."""
        return _reply(request, await service.leave(node_id))


def _trajectory_routes(r: APIRouter, service: DataflowService) -> None:
    @r.post("/v1/leases", openapi_extra=_body_doc(LeaseIn))
    async def lease(request: Request) -> Response:
        """Lease up to max_tasks tasks (long-poll up to ``wait`` s); empty under backpressure."""
        return _reply(request, await service.lease(await _read(request, LeaseIn)))

    @r.post("/v1/tasks", openapi_extra=_body_doc(TasksIn))
    async def post_tasks(request: Request) -> Response:
        """Queue tasks beside the run's task source (idempotent by task id)."""
        return _reply(request, await service.post_tasks(await _read(request, TasksIn)))

    @r.post("/v1/trajectories", openapi_extra=_body_doc(SubmitIn))
    async def submit(request: Request) -> Response:
        """Submit every policy's trajectories of one leased task (idempotent by task)."""
        return _reply(request, await service.submit(await _read(request, SubmitIn)))

    @r.post("/v1/trajectories/many", openapi_extra=_body_doc(SubmitManyIn))
    async def submit_many(request: Request) -> Response:
        """Several leased tasks' submissions at once; ``results`` answers each in order,
        as ``/v1/trajectories`` would, or with its ``error`` and ``status_code``."""
        req = await _read(request, SubmitManyIn)
        return _reply(request, {"results": await service.submit_many(req.submissions)})


def _batch_routes(r: APIRouter, service: DataflowService) -> None:
    @r.post("/v1/batches", openapi_extra=_body_doc(BatchIn),
            responses={204: {"description": "not enough trajectories before the timeout"}})
    async def get_batch(request: Request) -> Response:
        """Long-poll for a batch of n trajectories of one policy, advantages stamped;
        ``after`` a batch the trainer holds unacknowledged, the next one (fetch ahead)."""
        req = await _read(request, BatchIn)
        served = await service.get_batch(req.policy, req.n, req.timeout, req.trainer_id,
                                         req.after)
        if served is None:
            return Response(status_code=204)
        return _batch_reply(request, *served)

    @r.post("/v1/batches/{batch_id}/ack", openapi_extra=_body_doc(AckIn))
    async def ack_batch(request: Request, batch_id: str = BATCH_ID) -> Response:
        """Acknowledge a batch after the train step; reports the step's wait and duration."""
        req = await _read(request, AckIn)
        return _reply(request, await service.ack_batch(batch_id, req.wait_seconds,
                                                       req.step_seconds, req.metrics,
                                                       req.steps_left))


def _version_routes(r: APIRouter, service: DataflowService) -> None:
    @r.post("/v1/evals", openapi_extra=_body_doc(EvalIn))
    async def evals(request: Request) -> Response:
        """An evaluator's held-out scores of a policy version (the dashboard draws them)."""
        req = await _read(request, EvalIn)
        return _reply(request, service.evaluated(req.policy, req.version, req.metrics))

    @r.post("/v1/versions", openapi_extra=_body_doc(VersionIn))
    async def announce(request: Request) -> Response:
        """Announce a policy's new weight version (monotonic; repeats are no-ops)."""
        req = await _read(request, VersionIn)
        return _reply(request, await service.set_version(req.policy, req.version))

    @r.get("/v1/versions")
    async def versions(request: Request) -> Response:
        """The latest weight version of every policy."""
        return _reply(request, service.versions.all())

    @r.post("/v1/versions/wait", openapi_extra=_body_doc(VersionsWaitIn))
    async def wait_versions(request: Request) -> Response:
        """Long-poll up to ``wait`` s until a policy in ``have`` has a newer version;
        answers every policy's latest version (unchanged ones at the timeout)."""
        req = await _read(request, VersionsWaitIn)
        return _reply(request, await service.wait_versions(req.have, req.wait))


def _report_routes(r: APIRouter, service: DataflowService) -> None:
    @r.get("/v1/status")
    async def status(request: Request) -> Response:
        """Nodes, pools, versions, buffers and ledger counters."""
        return _reply(request, service.status())

    @r.get("/v1/autoscale")
    async def autoscale(request: Request) -> Response:
        """Per-pool dead-band target sizes from the trainers' wait fraction."""
        return _reply(request, service.autoscale_report())

    @r.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> PlainTextResponse:
        """Prometheus text exposition."""
        return PlainTextResponse(service.metrics(), media_type="text/plain; version=0.0.4")


def _echo_route(r: APIRouter) -> None:
    """A benchmark's surface only (``--bench-echo``): it validates nothing."""

    @r.post("/v1/echo")
    async def echo(request: Request) -> Response:
        """Read the body and answer its size: the stack's ceiling, for benchmarks.

        It answers the way every route does (``_reply``), so the ceiling carries the
        same per-request cost as a submission minus decoding, checking and storing.
        """
        return _reply(request, {"bytes": len(await request.body())})


def _openapi_builder(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """The schema of the routes, with every request model the bodies are read as."""

    def build_openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version,
                                 description=app.description, routes=app.routes)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in REQUEST_MODELS:
                js = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(js.pop("$defs", {}))
                components[model.__name__] = js
            app.openapi_schema = schema
        return app.openapi_schema

    return build_openapi


def _error_handlers(app: FastAPI, settings: DataflowSettings) -> None:
    """Every refusal as a 4xx (or 5xx) whose ``detail`` says what is wrong."""

    @app.exception_handler(ServiceError)
    @app.exception_handler(PayloadError)
    @app.exception_handler(sqlite3.Error)
    @app.exception_handler(OSError)
    async def refused(_request: Request, exc: Exception) -> JSONResponse:
        status, detail = refusal(exc, settings.store_path)  # type: ignore[arg-type]
        return JSONResponse({"detail": detail}, status_code=status)

    @app.exception_handler(RequestValidationError)
    async def request_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5]]
        return JSONResponse({"detail": "; ".join(parts)}, status_code=422)
