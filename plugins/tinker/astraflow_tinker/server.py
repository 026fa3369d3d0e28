"""The HTTP face of the service: the Tinker API's paths, as the unchanged SDK calls them.

Every path but ``/api/v1/healthz`` takes the SDK's ``X-API-Key`` header, checked against
the server's keys; bodies are size-limited; a request that cannot be served gets a 4xx
with a ``detail`` saying why (the SDK raises its own error type for each status).
"""

import asyncio
import hmac
import json
import logging
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.responses import JSONResponse, Response

from astraflow.security import BodySizeLimit
from astraflow_tinker import wire
from astraflow_tinker.ledger import owner_of
from astraflow_tinker.service import Service, ServiceError
from astraflow_tinker.worker import Outcome, Pending

log = logging.getLogger("astraflow.tinker")

#: the client config the SDK asks for first: plain HTTP transport, one forward_backward
#: chunk after another (they run in order anyway), no opt-in features
CLIENT_CONFIG = {"use_pyqwest_transport": False, "parallel_fwdbwd_chunks": False,
                 "pjwt_auth_enabled": False, "sample_use_retrieve_futures": False,
                 "custom_loss_server_side": False, "sample_join_sampling_session": False}

PROTOBUF = "application/x-protobuf"


def _owner(request: Request, x_api_key: str | None = Header(default=None)) -> str:
    """Who is calling: the owner of the ``X-API-Key`` header's key (401 without one)."""
    if not x_api_key:
        raise HTTPException(401, "missing X-API-Key header (TINKER_API_KEY)")
    keys: list[bytes] = request.app.state.keys
    if not any(hmac.compare_digest(x_api_key.encode(), k) for k in keys):
        raise HTTPException(401, "invalid API key")
    return owner_of(x_api_key)


async def _body(request: Request) -> dict[str, Any]:
    try:
        value = json.loads(await request.body() or b"{}")
    except ValueError as exc:
        raise HTTPException(400, f"the body is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise HTTPException(400, "the body must be a JSON object")
    return value


Who = Annotated[str, Depends(_owner)]
Body = Annotated[dict, Depends(_body)]


def future(pending: Pending, **extra: Any) -> dict[str, Any]:
    """The SDK's untyped future: what ``retrieve_future`` is asked about."""
    return {"request_id": pending.request_id, **extra}


def build_app(service: Service, keys: list[str], max_body_bytes: int = 64 << 20,
              poll_seconds: float = 20.0) -> FastAPI:
    """The app over ``service``; ``keys``: the API keys it accepts (each its own owner)."""
    app = FastAPI(title="astraflow tinker", docs_url=None, redoc_url=None)
    app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes)
    app.state.keys = [k.encode() for k in keys]

    @app.exception_handler(ServiceError)
    async def refused(_: Request, exc: ServiceError) -> JSONResponse:
        return JSONResponse({"detail": exc.message}, status_code=exc.status)

    @app.exception_handler(wire.WireError)
    async def malformed(_: Request, exc: wire.WireError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=400)

    _session_routes(app, service)
    _training_routes(app, service)
    _sampling_routes(app, service)
    _future_routes(app, service, poll_seconds)
    return app


def _session_routes(app: FastAPI, service: Service) -> None:
    @app.get("/api/v1/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/api/v1/client/config")
    async def client_config(_: Who) -> dict[str, Any]:
        return CLIENT_CONFIG

    @app.post("/api/v1/client/dynamic_config")
    async def dynamic_config(_: Who) -> dict[str, Any]:
        return {"refresh_interval_sec": 300, "sample_cancel_enabled": False}

    @app.post("/api/v1/telemetry")
    async def telemetry(_: Who) -> dict[str, str]:
        return {"status": "accepted"}  # nothing is kept: the run's metrics are its own

    @app.get("/api/v1/get_server_capabilities")
    async def capabilities(_: Who) -> dict[str, Any]:
        return service.capabilities()

    @app.post("/api/v1/create_session")
    async def create_session(who: Who, b: Body):
        return service.create_session(who, b)

    @app.post("/api/v1/session_heartbeat")
    async def heartbeat(who: Who, b: Body):
        service.session(who, str(b.get("session_id")))
        return {"type": "session_heartbeat"}

    @app.post("/api/v1/sessions/{session_id}/finish")
    async def finish(session_id: str, who: Who):
        service.session(who, session_id)
        service.ledger.finish_session(session_id)
        return {}

    @app.get("/api/v1/sessions/{session_id}")
    async def session(session_id: str, who: Who):
        service.session(who, session_id)
        models, samplers = service.ledger.session_items(session_id)
        return {"training_run_ids": models, "sampler_ids": samplers}


def _training_routes(app: FastAPI, service: Service) -> None:
    @app.post("/api/v1/create_model")
    async def create_model(who: Who, b: Body):
        return future(service.create_model(who, b))

    @app.post("/api/v1/get_info")
    async def get_info(who: Who, b: Body):
        return service.info(who, str(b.get("model_id")))

    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request, who: Who):
        if PROTOBUF not in request.headers.get("content-type", ""):
            raise HTTPException(415, f"forward_backward takes {PROTOBUF} (the tinker SDK's "
                                     "ForwardBackwardRequest)")
        decoded = wire.decode_forward_backward(await request.body())
        return future(service.forward_backward(who, decoded), model_id=decoded.model_id)

    # a model's JSON operations: each answers with the future of its work
    for path, operation in {"optim_step": service.optim_step,
                            "save_weights": service.save_weights,
                            "save_weights_for_sampler": service.save_for_sampler,
                            "load_weights": service.load_weights}.items():
        app.post(f"/api/v1/{path}", name=path)(_model_operation(operation))

    @app.get("/api/v1/training_runs/{model_id}/checkpoints")
    async def checkpoints(model_id: str, who: Who):
        return service.checkpoints(who, model_id)

    @app.get("/api/v1/training_runs/{model_id}")
    async def training_run(model_id: str, who: Who):
        return service.training_run(who, model_id)

    @app.get("/api/v1/astraflow/timeline")
    async def timeline(who: Who):
        """The compute thread's last operations on the caller's models and samplers:
        ``[lane, kind, started, finished]`` (monotonic seconds), oldest first."""
        mine = {m.model_id for m in service.ledger.models(who)}
        return {"operations": [list(op) for op in list(service.worker.timeline)
                               if op[0] in mine or _sampler_of(service, who, op[0])]}


def _model_operation(operation: Callable[[str, dict[str, Any]], Pending]
                     ) -> Callable[..., Any]:
    async def handle(who: Who, b: Body) -> dict[str, Any]:
        return future(operation(who, b), model_id=b.get("model_id"))
    return handle


def _sampler_of(service: Service, owner: str, lane: str) -> bool:
    if not lane.startswith("sampler:"):
        return False
    sampler = service.ledger.sampler(lane[len("sampler:"):])
    return sampler is not None and sampler.owner == owner


def _sampling_routes(app: FastAPI, service: Service) -> None:
    @app.post("/api/v1/create_sampling_session")
    async def create_sampling_session(who: Who, b: Body):
        return service.create_sampler(who, b)

    @app.get("/api/v1/samplers/{sampler_id}")
    async def sampler(sampler_id: str, who: Who):
        found = service.sampler(who, sampler_id)
        return {"sampler_id": found.sampler_id, "base_model": found.base_model,
                "model_path": found.model_path}

    @app.post("/api/v1/asample")
    async def asample(who: Who, b: Body):
        pending, ids = service.sample(who, b)
        return future(pending, sample_sequence_ids=ids)


def _future_routes(app: FastAPI, service: Service, poll_seconds: float) -> None:
    @app.post("/api/v1/retrieve_future")
    async def retrieve_future(who: Who, b: Body):
        request_id = str(b.get("request_id"))
        pending = service.worker.futures.get(request_id)
        if pending is None:
            # a request of a server that was restarted (or one answered long ago)
            return {"error": f"request {request_id} is unknown here: the server restarted "
                             "before it finished (a model is back at its last saved state)",
                    "category": "server"}
        if not _mine(service, who, pending.lane):
            raise HTTPException(403, f"request {request_id} belongs to another API key")
        try:
            outcome: Outcome = await asyncio.wait_for(asyncio.shield(pending.done),
                                                      timeout=poll_seconds)
        except TimeoutError:
            return {"type": "try_again", "request_id": request_id, "queue_state": "active"}
        if outcome.error is not None:
            return {"error": outcome.error, "category": outcome.category}
        if outcome.body is not None:
            return Response(outcome.body, media_type=PROTOBUF)
        return outcome.json


def _mine(service: Service, owner: str, lane: str) -> bool:
    if lane.startswith("sampler:"):
        return _sampler_of(service, owner, lane)
    model = service.ledger.model(lane)
    return model is not None and model.owner == owner
