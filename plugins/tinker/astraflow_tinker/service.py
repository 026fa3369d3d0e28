"""What the Tinker API's calls do here: tenants on one engine, recorded in the ledger.

Every model is a LoRA tenant of the one base model the server serves, owned by the API
key that created it: another key gets a 403, an unknown id a 404. Operations that touch
the model run on the :class:`~.worker.Worker`'s lanes and answer through futures; the
rest answer at once. A tenant the engine does not hold (the server was restarted) is
brought back from its last saved state, or made again from its LoRA shape and seed when
it never saved one, the first time a request needs it.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import re
import threading
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

from astraflow_tinker import wire
from astraflow_tinker.engine import AdamParams, Datum, Engine, EngineError, LoraSpec
from astraflow_tinker.ledger import Checkpoint, Ledger, Model, Sampler
from astraflow_tinker.sampling import SampleRequest
from astraflow_tinker.worker import Outcome, Pending, Worker

log = logging.getLogger("astraflow.tinker")

_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
#: operations whose retry is recognised (a retry comes within minutes, not 100k calls)
SEEN_KEPT = 100_000
#: a sample request's ceiling on sequences (the SDK's own default client caps nothing)
MAX_SAMPLES = 128


class ServiceError(Exception):
    """A request refused at once: ``status`` (400/403/404...) and what is wrong."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _user_errors(work):
    """An operation whose :class:`EngineError` is the client's failure, not the server's."""
    def run() -> Outcome:
        try:
            return work()
        except (EngineError, wire.WireError, ServiceError) as exc:
            return Outcome(error=str(exc), category="user")
    return run


class Service:
    def __init__(self, engine: Engine, served_name: str, model_dir: Path, state: Path,
                 worker: Worker) -> None:
        self.engine = engine
        self.served_name = served_name
        self.model_dir = model_dir
        self.state = state
        self.ledger = Ledger(state / "ledger.sqlite")
        self.worker = worker
        #: (model, seq_id) -> request id of the operations still answerable, to answer
        #: the SDK's retry of one with the same future (bounded: the oldest go first)
        self._seen: collections.OrderedDict[tuple[str, int], str] = collections.OrderedDict()
        self._loaded_samplers: set[str] = set()
        #: when each model was last asked for work (this server's life; the ledger's
        #: value before it)
        self._last_request: dict[str, float] = {}
        #: sample requests waiting for their sampler's next batch
        self._waiting: dict[str, list[tuple[SampleRequest, dict[str, Any], Pending]]] = {}
        self._waiting_lock = threading.Lock()

    # ---- sessions, info ----------------------------------------------------------
    def create_session(self, owner: str, body: dict[str, Any]) -> dict[str, Any]:
        session_id = f"sess-{uuid.uuid4().hex[:16]}"
        self.ledger.add_session(session_id, owner, {
            k: body.get(k) for k in ("tags", "user_metadata", "display_name", "project_id")
            if body.get(k) is not None})
        return {"session_id": session_id, "type": "create_session"}

    def session(self, owner: str, session_id: str) -> None:
        found = self.ledger.session_owner(session_id)
        if found is None:
            raise ServiceError(404, f"no session {session_id!r}")
        if found != owner:
            raise ServiceError(403, f"session {session_id!r} belongs to another API key")

    def capabilities(self) -> dict[str, Any]:
        return {"supported_models": [{"model_name": self.served_name, "trainable": True,
                                      "sampleable": True,
                                      "max_context_length": self.engine.context}]}

    def model(self, owner: str, model_id: str) -> Model:
        return _owned(self.ledger.model(model_id), owner, f"model {model_id!r}")

    def info(self, owner: str, model_id: str) -> dict[str, Any]:
        model = self.model(owner, model_id)
        return {"model_id": model_id, "type": "get_info", "is_lora": True,
                "lora_rank": model.spec["rank"], "model_name": model.base_model,
                "optimizer_config": {"type": "adamw"},
                "model_data": {"arch": self.engine.arch, "model_name": model.base_model,
                               "tokenizer_id": str(self.model_dir)}}

    # ---- training models ----------------------------------------------------------
    def create_model(self, owner: str, body: dict[str, Any]) -> Pending:
        session_id = str(body.get("session_id"))
        self.session(owner, session_id)
        base = body.get("base_model")
        if base != self.served_name:
            raise ServiceError(400, f"base_model {base!r} is not served here; served: "
                                    f"[{self.served_name!r}]")
        lora = body.get("lora_config") or {}
        if not isinstance(lora, dict):
            raise ServiceError(400, "lora_config: expected an object")
        spec = LoraSpec(rank=_count(lora, "rank", 32), seed=lora.get("seed"),
                        train_mlp=bool(lora.get("train_mlp", True)),
                        train_attn=bool(lora.get("train_attn", True)),
                        train_unembed=bool(lora.get("train_unembed", True)))
        if not 1 <= spec.rank <= 256:
            raise ServiceError(400, f"lora_config.rank={spec.rank}: expected 1..256")
        if spec.seed is not None and not isinstance(spec.seed, int):
            raise ServiceError(400, f"lora_config.seed={spec.seed!r}: expected an integer")
        model_id = f"{session_id}:train:{_count(body, 'model_seq_id', 0)}"
        known = self.ledger.model(model_id)
        if known is not None:  # the same request again (a transport retry): the same model
            _owned(known, owner, f"model {model_id!r}")
            return self.worker.submit(model_id, "create_model", lambda: Outcome(
                json={"model_id": model_id, "type": "create_model"}))
        self.ledger.add_model(model_id, session_id, owner, base, asdict(spec),
                              body.get("user_metadata") or {})

        def create() -> Outcome:
            if model_id in self.engine.tenants():
                self.engine.drop(model_id)
            self.engine.create(model_id, spec)
            return Outcome(json={"model_id": model_id, "type": "create_model"})
        return self.worker.submit(model_id, "create_model", _user_errors(create))

    def _tenant(self, model: Model) -> None:
        """Make sure the engine holds ``model`` (worker thread)."""
        if model.model_id in self.engine.tenants():
            return
        checkpoint = self.ledger.checkpoint(model.last_state) if model.last_state else None
        if checkpoint is not None:
            self.engine.load_state(model.model_id, Path(checkpoint.dir), optimizer=True)
            log.warning("tinker: %s restored from its last saved state %s",
                        model.model_id, checkpoint.path)
        else:
            self.engine.create(model.model_id, LoraSpec(**model.spec))
            log.warning("tinker: %s made again from its LoRA shape (it never saved a state)",
                        model.model_id)

    def _ordered(self, owner: str, model_id: str, seq_id: int | None, kind: str,
                 work) -> Pending:
        """Queue a model's operation, once per ``seq_id`` (the SDK's retries send it
        again under a new idempotency key)."""
        model = self.model(owner, model_id)
        if seq_id is not None and (not isinstance(seq_id, int) or isinstance(seq_id, bool)):
            raise ServiceError(400, f"seq_id={seq_id!r}: expected a whole number")
        if seq_id is not None and (model_id, seq_id) in self._seen:
            known = self.worker.futures.get(self._seen[(model_id, seq_id)])
            if known is not None:
                return known
        self._last_request[model_id] = time.time()  # kept in memory: no fsync per call

        def run() -> Outcome:
            self._tenant(model)
            return work()
        pending = self.worker.submit(model_id, kind, _user_errors(run))
        if seq_id is not None:
            self._seen[(model_id, seq_id)] = pending.request_id
            while len(self._seen) > SEEN_KEPT:
                self._seen.popitem(last=False)
        return pending

    def forward_backward(self, owner: str, request: wire.ForwardBackward) -> Pending:
        data = [Datum(tokens, inputs) for tokens, inputs in request.data]
        if not data:
            raise ServiceError(400, "forward_backward: no data")
        kind = "forward" if request.forward_only else "forward_backward"

        def work() -> Outcome:
            logprobs, metrics = self.engine.forward_backward(
                request.model_id, data, request.loss_fn, request.config,
                forward_only=request.forward_only)
            return Outcome(body=wire.encode_forward_backward(logprobs, metrics))
        return self._ordered(owner, request.model_id, request.seq_id, kind, work)

    def optim_step(self, owner: str, body: dict[str, Any]) -> Pending:
        raw = body.get("adam_params")
        if not isinstance(raw, dict):
            raise ServiceError(400, "optim_step: adam_params is required (this server "
                                    "trains with AdamW only)")
        try:
            params = AdamParams(**{k: float(v) for k, v in raw.items()
                                   if k in AdamParams.__dataclass_fields__})
        except (TypeError, ValueError) as exc:
            raise ServiceError(400, f"optim_step: adam_params: {exc}") from None
        if params.learning_rate < 0 or not 0 <= params.beta1 < 1 or not 0 <= params.beta2 < 1:
            raise ServiceError(400, f"optim_step: adam_params out of range: {raw}")
        model_id = str(body.get("model_id"))

        def work() -> Outcome:
            return Outcome(json={"metrics": self.engine.optim_step(model_id, params),
                                 "type": "optim_step"})
        return self._ordered(owner, model_id, body.get("seq_id"), "optim_step", work)

    # ---- checkpoints ---------------------------------------------------------------
    def _checkpoint_dir(self, model_id: str, kind: str, name: str) -> Path:
        key = hashlib.sha256(model_id.encode()).hexdigest()[:16]
        return self.state / "checkpoints" / key / kind / name

    def _new_checkpoint(self, owner: str, body: dict[str, Any], kind: str) -> Checkpoint:
        model_id, name = str(body.get("model_id")), body.get("path")
        self.model(owner, model_id)
        if not isinstance(name, str) or not _NAME.match(name):
            raise ServiceError(400, f"{kind}: path {name!r} is not a checkpoint name "
                                    "(1-128 of A-Z a-z 0-9 . _ -)")
        path = f"tinker://{model_id}/{kind}/{name}"
        if self.ledger.checkpoint(path) is not None and not body.get("overwrite"):
            raise ServiceError(400, f"checkpoint {path} exists; pass overwrite=True")
        ttl = body.get("ttl_seconds")
        if ttl is not None and (not isinstance(ttl, int | float) or ttl <= 0):
            raise ServiceError(400, f"ttl_seconds={ttl!r}: expected a positive number")
        return Checkpoint(path, model_id, owner, kind, name,
                          str(self._checkpoint_dir(model_id, kind, name)), time.time(),
                          None if ttl is None else time.time() + float(ttl),
                          body.get("user_metadata") or {})

    def save_weights(self, owner: str, body: dict[str, Any]) -> Pending:
        checkpoint = self._new_checkpoint(owner, body, "weights")

        def work() -> Outcome:
            self.engine.save_state(checkpoint.model_id, Path(checkpoint.dir), optimizer=True)
            self.ledger.add_checkpoint(checkpoint)
            return Outcome(json={"path": checkpoint.path, "type": "save_weights"})
        return self._ordered(owner, checkpoint.model_id, body.get("seq_id"), "save_state",
                             work)

    def save_for_sampler(self, owner: str, body: dict[str, Any]) -> Pending:
        model_id = str(body.get("model_id"))
        if body.get("path") is None:  # save_weights_and_get_sampling_client
            return self._ephemeral_sampler(owner, model_id, body)
        checkpoint = self._new_checkpoint(owner, body, "sampler_weights")

        def work() -> Outcome:
            self.engine.save_sampler(checkpoint.model_id, Path(checkpoint.dir))
            self.ledger.add_checkpoint(checkpoint)
            return Outcome(json={"path": checkpoint.path,
                                 "type": "save_weights_for_sampler"})
        return self._ordered(owner, model_id, body.get("seq_id"), "save_sampler", work)

    def _ephemeral_sampler(self, owner: str, model_id: str, body: dict[str, Any]) -> Pending:
        model = self.model(owner, model_id)
        sampler_id = (f"{model.session_id}:sample:"
                      f"{_count(body, 'sampling_session_seq_id', 0)}")
        directory = self.state / "samplers" / hashlib.sha256(
            sampler_id.encode()).hexdigest()[:16]

        def work() -> Outcome:
            self.engine.save_sampler(model_id, directory)
            self.ledger.add_sampler(Sampler(sampler_id, model.session_id, owner,
                                            model.base_model, None, str(directory)))
            self._loaded_samplers.discard(sampler_id)
            return Outcome(json={"sampling_session_id": sampler_id})
        return self._ordered(owner, model_id, body.get("seq_id"), "save_sampler", work)

    def _owned_checkpoint(self, owner: str, path: Any) -> Checkpoint:
        if not isinstance(path, str) or not path.startswith("tinker://"):
            raise ServiceError(400, f"path {path!r}: expected tinker://<model>/<kind>/<name>")
        return _owned(self.ledger.checkpoint(path), owner, f"checkpoint {path}")

    def load_weights(self, owner: str, body: dict[str, Any]) -> Pending:
        checkpoint = self._owned_checkpoint(owner, body.get("path"))
        if checkpoint.kind != "weights":
            raise ServiceError(400, f"{checkpoint.path} holds sampler weights; load_state "
                                    "takes a save_state path (tinker://.../weights/...)")
        optimizer = bool(body.get("optimizer", False))
        if body.get("model_id") is None:  # create_training_client_from_state
            session_id = str(body.get("session_id"))
            self.session(owner, session_id)
            source = self.ledger.model(checkpoint.model_id)
            model_id = f"{session_id}:train:{_count(body, 'model_seq_id', 0)}"
            self.ledger.add_model(model_id, session_id, owner,
                                  source.base_model if source else self.served_name,
                                  source.spec if source else {}, body.get("user_metadata")
                                  or {})
            seq_id = None
        else:
            model_id, seq_id = str(body["model_id"]), body.get("seq_id")

        def work() -> Outcome:
            self.engine.load_state(model_id, Path(checkpoint.dir), optimizer=optimizer)
            return Outcome(json={"path": checkpoint.path, "model_id": model_id,
                                 "type": "load_weights"})
        if seq_id is None:  # a new model: nothing of it to restore first
            self.model(owner, model_id)
            return self.worker.submit(model_id, "load_state", _user_errors(work))
        return self._ordered(owner, model_id, seq_id, "load_state", work)

    def checkpoints(self, owner: str, model_id: str) -> dict[str, Any]:
        self.model(owner, model_id)
        return {"checkpoints": [{
            "checkpoint_id": f"{c.kind}/{c.name}",
            "checkpoint_type": "training" if c.kind == "weights" else "sampler",
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(c.created)),
            "tinker_path": c.path, "public": False, "user_metadata": c.metadata or None,
        } for c in self.ledger.checkpoints(model_id)]}

    def training_run(self, owner: str, model_id: str) -> dict[str, Any]:
        model = self.model(owner, model_id)
        return {"training_run_id": model_id, "base_model": model.base_model,
                "model_owner": owner, "is_lora": True, "lora_rank": model.spec["rank"],
                "last_request_time": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                   time.gmtime(self._last_request.get(
                                                       model_id, model.last_request))),
                "user_metadata": model.metadata or None}

    # ---- sampling -----------------------------------------------------------------------
    def create_sampler(self, owner: str, body: dict[str, Any]) -> dict[str, Any]:
        session_id = str(body.get("session_id"))
        self.session(owner, session_id)
        sampler_id = f"{session_id}:sample:{_count(body, 'sampling_session_seq_id', 0)}"
        path, base = body.get("model_path"), body.get("base_model")
        if path is not None:
            checkpoint = self._owned_checkpoint(owner, path)
            base = self.ledger.model(checkpoint.model_id).base_model  # type: ignore[union-attr]
            directory: str | None = checkpoint.dir
        elif base == self.served_name:
            directory = None
        else:
            raise ServiceError(400, f"base_model {base!r} is not served here; served: "
                                    f"[{self.served_name!r}]")
        self.ledger.add_sampler(Sampler(sampler_id, session_id, owner, str(base), path,
                                        directory))
        self._loaded_samplers.discard(sampler_id)
        return {"sampling_session_id": sampler_id, "type": "create_sampling_session"}

    def sampler(self, owner: str, sampler_id: str) -> Sampler:
        return _owned(self.ledger.sampler(sampler_id), owner, f"sampler {sampler_id!r}")

    def sample(self, owner: str, body: dict[str, Any]) -> tuple[Pending, list[str]]:
        sampler = self.sampler(owner, str(body.get("sampling_session_id")))
        prompt = wire.json_tokens(body.get("prompt"))
        n = body.get("num_samples", 1)
        if not isinstance(n, int) or not 1 <= n <= MAX_SAMPLES:
            raise ServiceError(400, f"num_samples={n!r}: expected 1..{MAX_SAMPLES}")
        for unsupported in ("topk_prompt_logprobs", "topk_sample_logprobs",
                            "prompt_alt_tokens_k"):
            if body.get(unsupported):
                raise ServiceError(400, f"{unsupported} is not served by this server")
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise ServiceError(400, "sampling_params: expected an object")
        args = _sampling_args(params, len(prompt), self.engine.context)
        lane = f"sampler:{sampler.sampler_id}"
        if body.get("prompt_logprobs"):  # a prompt scored (compute_logprobs): alone

            def alone() -> Outcome:
                samples, prompt_lp = self.engine.sample(
                    self._sampler_loaded(sampler), prompt, n, prompt_logprobs=True, **args)
                return Outcome(body=wire.encode_sample(samples, prompt_lp))
            pending = self.worker.submit(lane, "sample", _user_errors(alone))
        else:
            pending = self.worker.future(lane, "sample")
            with self._waiting_lock:
                waiting = self._waiting.setdefault(sampler.sampler_id, [])
                waiting.append((SampleRequest(prompt, n, args.pop("max_tokens"),
                                              args.pop("seed")), args, pending))
                first = len(waiting) == 1
            if first:  # the batch that takes it, and every request queued meanwhile
                self.worker.submit(lane, "sample_batch", lambda: self._sample_batch(sampler))
        return pending, [f"{pending.request_id}:{i}" for i in range(n)]

    def _sample_batch(self, sampler: Sampler) -> Outcome:
        """Every request waiting for ``sampler`` (worker thread), in one batch per set of
        sampling parameters; each answers its own future."""
        with self._waiting_lock:
            waiting = self._waiting.pop(sampler.sampler_id, [])
        groups: dict[str, list[tuple[SampleRequest, dict[str, Any], Pending]]] = {}
        for item in waiting:
            groups.setdefault(repr(sorted(item[1].items())), []).append(item)
        for group in groups.values():
            args = group[0][1]
            try:
                results = self.engine.sample_many(self._sampler_loaded(sampler),
                                                  [request for request, _, _ in group], **args)
                outcomes = [Outcome(body=wire.encode_sample(r, None)) for r in results]
            except EngineError:
                outcomes = [self._sample_alone(sampler, request, args)
                            for request, _, _ in group]  # which request was at fault
            except Exception as exc:  # every waiting request hears of it, none hangs
                log.exception("tinker: a batch of %d samples failed", len(group))
                outcomes = [Outcome(error=f"sample failed on the server: {exc!r}",
                                    category="server")] * len(group)
            for (_, _, pending), outcome in zip(group, outcomes, strict=True):
                self.worker.settle(pending, outcome)
        return Outcome(json={})

    def _sample_alone(self, sampler: Sampler, request: SampleRequest,
                      args: dict[str, Any]) -> Outcome:
        try:
            samples, _ = self.engine.sample(self._sampler_loaded(sampler), request.prompt,
                                            request.num_samples, request.max_tokens,
                                            seed=request.seed, **args)
        except EngineError as exc:
            return Outcome(error=str(exc), category="user")
        except Exception as exc:
            log.exception("tinker: a sample failed")
            return Outcome(error=f"sample failed on the server: {exc!r}", category="server")
        return Outcome(body=wire.encode_sample(samples, None))

    def _sampler_loaded(self, sampler: Sampler) -> str | None:
        if sampler.dir is None:
            return None
        if sampler.sampler_id not in self._loaded_samplers:
            self.engine.load_sampler(sampler.sampler_id, Path(sampler.dir))
            self._loaded_samplers.add(sampler.sampler_id)
        return sampler.sampler_id


def _count(body: dict[str, Any], key: str, default: int) -> int:
    """``body[key]``, a whole number of at least 0 (a 400 naming it otherwise)."""
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ServiceError(400, f"{key}={value!r}: expected a whole number >= 0")
    return value


Owned = TypeVar("Owned", Model, Checkpoint, Sampler)


def _owned(found: Owned | None, owner: str, what: str) -> Owned:
    """``found`` if ``owner``'s: a 404 when there is none, a 403 when another key's."""
    if found is None:
        raise ServiceError(404, f"no {what}")
    if found.owner != owner:
        raise ServiceError(403, f"{what} belongs to another API key")
    return found


def _sampling_args(params: dict[str, Any], prompt_length: int, context: int) -> dict[str, Any]:
    """The engine's sampling arguments from the SDK's ``SamplingParams``."""
    room = context - prompt_length
    max_tokens = params.get("max_tokens")
    max_tokens = room if max_tokens is None else max_tokens
    if not isinstance(max_tokens, int) or not 1 <= max_tokens <= room:
        raise ServiceError(400, f"sampling_params.max_tokens={max_tokens!r}: the prompt is "
                                f"{prompt_length} tokens of a {context}-token context, so "
                                f"1..{room}")
    stop = params.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not (all(isinstance(s, str) for s in stop)
                                 or all(isinstance(s, int) for s in stop)):
        raise ServiceError(400, "sampling_params.stop: strings or token ids, not both")
    seed = params.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise ServiceError(400, f"sampling_params.seed={seed!r}: expected an integer")
    return {"max_tokens": max_tokens, "temperature": _number(params, "temperature", 1.0),
            "top_k": int(_number(params, "top_k", -1)), "top_p": _number(params, "top_p", 1.0),
            "stop": stop, "seed": seed}


def _number(params: dict[str, Any], key: str, default: float) -> float:
    value = params.get(key, default)
    if value is None:
        return default
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ServiceError(400, f"sampling_params.{key}={value!r}: expected a number")
    return float(value)
