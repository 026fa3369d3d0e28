"""An OpenAI-compatible endpoint on a RaaS node, served from the node's engine.

``POST /v1/chat/completions``, ``POST /v1/completions`` and ``GET /v1/models``, the
routes and fields the ``openai`` client and agent frameworks send; ``POST /v1/responses``
(OpenAI's Responses API, :mod:`.responses`) and ``POST /v1/messages`` (Anthropic's
Messages API, :mod:`.messages`) answer from the same chat call. Every rollout gets
its own API key: a call with any other key is refused (401), and every call is
recorded against its rollout (:mod:`astraflow.gateway.record`). Generation goes through
the node's policy handles -- the rollout-backend contract -- so the endpoint works on
every backend (``raas=hf``, ``vllm``, ``sglang``, ...).

What the engine contract does not give is not faked: ``top_logprobs`` lists are empty
(engines report the sampled token's log-prob only), and a streamed answer arrives in
one content chunk once it is complete.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from astraflow.gateway import messages as messages_api
from astraflow.gateway import responses as responses_api
from astraflow.gateway.record import Plan, Session, content_text, render_messages
from astraflow.gateway.settings import GatewaySettings
from astraflow.gateway.tools import parse_tool_calls, resolve_parser, stop_after_call
from astraflow.types import Generation, Task

__all__ = ["Gateway", "GatewayError", "GatewaySettings"]

log = logging.getLogger(__name__)


class GatewayError(Exception):
    """Answered as OpenAI answers errors: ``{"error": {"message", "type", "param"}}``."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind


@dataclass
class ChatTurn:
    """One chat call's outcome: per sample, the reply message (chat completions' shape),
    why it ended (``stop``, ``length``, ``tool_calls``) and the stop string that ended
    it, if one did."""

    role: str
    plan: Plan
    generations: list[Generation]
    replies: list[dict[str, Any]] = field(default_factory=list)
    finish: list[str] = field(default_factory=list)
    stopped_by: list[str | None] = field(default_factory=list)


#: path -> (method, handler)
_ROUTES = {"/v1/chat/completions": ("POST", "_chat"),
           "/v1/completions": ("POST", "_completions"),
           "/v1/responses": ("POST", "_responses"),
           "/v1/messages": ("POST", "_messages"),
           "/v1/messages/count_tokens": ("POST", "_count_tokens"),
           "/v1/models": ("GET", "_models")}
#: the route whose errors are in Anthropic's format
_MESSAGES = "/v1/messages"


def _json(payload: dict[str, Any], status: int = 200) -> Any:
    body = json.dumps(payload).encode()

    async def reply(send: Any) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return reply


def _events(events: list[dict[str, Any]] | list[tuple[str, dict[str, Any]]],
            done: bool = True) -> Any:
    """Server-sent events -- (name, data) pairs are sent with their ``event:`` line --
    then ``[DONE]`` (``done``), as the chat completions API ends a stream."""
    body = b"".join((f"event: {e[0]}\ndata: {json.dumps(e[1])}\n\n" if isinstance(e, tuple)
                     else f"data: {json.dumps(e)}\n\n").encode() for e in events)
    if done:
        body += b"data: [DONE]\n\n"

    async def reply(send: Any) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8"),
                                (b"cache-control", b"no-cache")]})
        await send({"type": "http.response.body", "body": body})

    return reply


def _bad(message: str, param: str | None = None) -> GatewayError:
    return GatewayError(400, message, param)


def _number(body: dict[str, Any], key: str, default: Any, lo: float, hi: float,
            integer: bool = False) -> Any:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or (
            integer and not isinstance(value, int)):
        raise _bad(f"'{key}' must be {'an integer' if integer else 'a number'}, got "
                   f"{value!r}", key)
    if not lo <= value <= hi:
        raise _bad(f"'{key}' must be between {lo:g} and {hi:g}, got {value!r}", key)
    return value


class Gateway:
    """One per node. ``open(task, policies, ...)`` gives a rollout its key and base URL;
    ``close(key)`` ends it and returns its recording."""

    def __init__(self, tokenizer: Any, settings: GatewaySettings | None = None) -> None:
        self.tokenizer = tokenizer
        self.settings = settings or GatewaySettings()
        self.parser = resolve_parser(self.settings.tool_parser, tokenizer.chat_template)
        self.sessions: dict[str, Session] = {}
        #: how many calls were answered with each HTTP status (errors are logged too)
        self.answered: collections.Counter[int] = collections.Counter()
        self.url = ""
        self._server: Any = None
        self._task: asyncio.Task | None = None

    # -- life cycle --------------------------------------------------------------------
    async def start(self) -> str:
        import uvicorn

        from astraflow.dataflow import listen

        s = self.settings
        sock = listen.bind(s.host, s.port)
        self.url = listen.url(s.advertise_host or s.host, sock)

        class _Server(uvicorn.Server):
            # the node owns SIGINT/SIGTERM: the gateway is stopped with it
            @contextlib.contextmanager
            def capture_signals(self):
                yield

        config = uvicorn.Config(self.app, interface="asgi3", log_level="warning",
                                access_log=False, lifespan="off", timeout_keep_alive=75)
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError("the gateway stopped while starting")
            await asyncio.sleep(0.01)
        return self.url

    async def stop(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, 10)
            self._server = self._task = None

    def open(self, task: Task, policies: dict[str, Any], group_id: str, sample: int) -> Session:
        key = f"sk-astraflow-{secrets.token_urlsafe(24)}"
        session = Session(key, task, group_id, sample, dict(policies), self.tokenizer)
        self.sessions[key] = session
        return session

    def close(self, key: str) -> Session:
        """The key stops working: a call still arriving for this rollout gets a 401."""
        return self.sessions.pop(key)

    # -- HTTP --------------------------------------------------------------------------
    # A plain ASGI app: five routes, one key check, one body limit. Every call of every
    # rollout passes through here, so it does no more per request than that.
    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        try:
            route = _ROUTES.get(scope["path"].rstrip("/"))
            if route is None:
                raise GatewayError(404, f"no route {scope['path']}: this endpoint serves "
                                   f"{', '.join(f'{m} {p}' for p, (m, _) in _ROUTES.items())}",
                                   kind="not_found_error")
            method, handler = route
            if scope["method"] != method:
                raise GatewayError(405, f"{scope['path']} takes {method}")
            headers = dict(scope["headers"])
            session = self._session(headers)
            body = await self._body(headers, receive) if method == "POST" else {}
            reply = await getattr(self, handler)(session, body)
            self.answered[200] += 1
        except GatewayError as exc:
            reply = self._error(scope["path"], exc)
        except Exception as exc:  # a bug here: the agent gets a 500 saying what
            log.exception("gateway: %s %s failed", scope["method"], scope["path"])
            reply = self._error(scope["path"], GatewayError(
                500, f"{type(exc).__name__}: {exc}", kind="server_error"))
        await reply(send)

    def _error(self, path: str, exc: GatewayError) -> Any:
        """An error as the API the route belongs to writes one; counted and logged."""
        self.answered[exc.status] += 1
        log.warning("gateway: %s answered %d: %s", path, exc.status, exc.message)
        if path.rstrip("/").startswith(_MESSAGES):
            return _json(messages_api.error_body(exc.status, exc.message), exc.status)
        return _json({"error": {"message": exc.message, "type": exc.kind,
                                "param": exc.param, "code": None}}, exc.status)

    def _session(self, headers: dict[bytes, bytes]) -> Session:
        """The rollout whose key the call carries: ``Authorization: Bearer <key>`` (the
        ``openai`` client) or ``x-api-key: <key>`` (the ``anthropic`` client)."""
        header = headers.get(b"authorization", b"").decode("latin-1")
        key = header[7:].strip() if header[:7].lower() == "bearer " else \
            headers.get(b"x-api-key", b"").decode("latin-1").strip()
        session = self.sessions.get(key)
        if session is None:
            raise GatewayError(401, "invalid API key: each rollout has its own key, given "
                               "to its agent; this one is unknown or its rollout has ended",
                               kind="authentication_error")
        return session

    async def _body(self, headers: dict[bytes, bytes], receive: Any) -> dict[str, Any]:
        limit = self.settings.max_body_bytes
        declared = headers.get(b"content-length", b"")
        too_large = GatewayError(413, f"the request body exceeds {limit} bytes "
                                 "(agent.max_body_bytes)")
        if declared.isdigit() and int(declared) > limit:
            raise too_large
        chunks, seen, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise GatewayError(400, "the client went away before sending its body")
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > limit:
                raise too_large
            chunks.append(chunk)
            more = message.get("more_body", False)
        try:
            body = json.loads(b"".join(chunks))
        except ValueError as exc:
            raise _bad(f"the request body is not JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise _bad("the request body must be a JSON object")
        return body

    async def _models(self, session: Session, _body: dict[str, Any]) -> Any:
        return _json({"object": "list", "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "astraflow"}
            for name in session.policies]})

    def _role(self, session: Session, body: dict[str, Any]) -> str:
        model = body.get("model")
        if not isinstance(model, str) or model not in session.policies:
            served = ", ".join(session.policies)
            raise GatewayError(404, f"the model {model!r} does not exist here; this rollout "
                               f"can call: {served}", "model", kind="not_found_error")
        return str(model)

    def _sampling(self, body: dict[str, Any], prompt_len: int, tools: bool) -> dict[str, Any]:
        s = self.settings
        limit = self.tokenizer.context_length
        if prompt_len == 0:
            raise _bad("the prompt renders to no tokens: give it some text", "messages")
        if limit is not None and prompt_len >= limit:
            raise _bad(f"This model's maximum context length is {limit} tokens; the prompt "
                       f"is {prompt_len} tokens. Shorten the messages.", "messages")
        requested = body.get("max_completion_tokens", body.get("max_tokens"))
        key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        max_tokens = _number({key: requested}, key, s.max_tokens, 1, 1 << 20, integer=True)
        if s.max_tokens_cap is not None:
            max_tokens = min(max_tokens, s.max_tokens_cap)
        if limit is not None:
            max_tokens = min(max_tokens, limit - prompt_len)
        stop = body.get("stop")
        stops = [stop] if isinstance(stop, str) else (stop or [])
        if not isinstance(stops, list) or not all(isinstance(x, str) and x for x in stops) \
                or len(stops) > 4:
            raise _bad("'stop' must be a string or a list of up to 4 non-empty strings",
                       "stop")
        stop_ids = list(self.tokenizer.stop_token_ids)
        for text in stops:
            try:
                ids = self.tokenizer.encode(text)
            except ValueError as exc:  # text this tokenizer cannot spell
                raise _bad(f"'stop': {exc}", "stop") from exc
            if len(ids) == 1:
                stop_ids.append(ids[0])
        if tools:
            stop_ids += stop_after_call(self.parser, self.tokenizer)
        seed = body.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise _bad("'seed' must be an integer", "seed")
        return {
            "n": _number(body, "n", 1, 1, s.max_n, integer=True),
            "temperature": float(_number(body, "temperature", s.temperature, 0, 2)),
            "top_p": float(_number(body, "top_p", 1.0, 1e-9, 1)),
            "max_new_tokens": int(max_tokens),
            "stop_token_ids": list(dict.fromkeys(stop_ids)),
            "seed": seed,
            "stops": stops,
        }

    async def _generate(self, session: Session, role: str, plan: Plan,
                        sampling: dict[str, Any]) -> list[Generation]:
        params = {k: v for k, v in sampling.items() if k != "stops"}
        generations = await session.policies[role].generate(plan.prompt_ids, **params)
        return [self._cut_at_stop(gen, sampling["stops"]) for gen in generations]

    def _cut_at_stop(self, gen: Generation, stops: list[str]) -> Generation:
        """A stop string of several tokens ends the text where it appears; the tokens
        sampled after it are dropped (never returned, never trained)."""
        multi = [s for s in stops if len(self.tokenizer.encode(s)) > 1]
        if not multi:
            return gen
        for end in range(1, len(gen.token_ids) + 1):
            text = self.tokenizer.decode(gen.token_ids[:end])
            if any(s in text for s in multi):
                return gen.head(end, "stop")
        return gen

    def _text(self, gen: Generation, stops: list[str]) -> str:
        ids = [t for t in gen.token_ids if t not in self.tokenizer.stop_token_ids]
        text = self.tokenizer.decode(ids)
        for s in stops:
            if gen.finish_reason == "stop" and s in text:
                text = text[: text.index(s)]
        return text

    def _logprobs(self, gen: Generation) -> list[dict[str, Any]]:
        out = []
        for token, lp in zip(gen.token_ids, gen.logprobs, strict=True):
            text = self.tokenizer.decode([token], skip_special_tokens=False)
            out.append({"token": text, "logprob": lp, "bytes": list(text.encode()),
                        "top_logprobs": []})
        return out

    async def _chat(self, session: Session, body: dict[str, Any]) -> Any:
        turn = await self.chat_turn(session, body)
        choices = []
        for index, (gen, message) in enumerate(zip(turn.generations, turn.replies,
                                                   strict=True)):
            choice: dict[str, Any] = {"index": index, "message": message,
                                      "finish_reason": turn.finish[index],
                                      "logprobs": {"content": self._logprobs(gen)}
                                      if body.get("logprobs") else None}
            if body.get("return_token_ids"):
                choice["token_ids"] = list(gen.token_ids)
            choices.append(choice)
        return self._reply("chat.completion", turn.role, choices, turn.plan, turn.generations,
                           body)

    async def chat_turn(self, session: Session, body: dict[str, Any]) -> ChatTurn:
        """One chat call, sampled and recorded: what every chat-shaped API (chat
        completions, Responses, Messages) answers from. ``body`` is in the chat
        completions API's terms."""
        role = self._role(session, body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise _bad("'messages' must be a non-empty list of objects with a 'role'",
                       "messages")
        tools = body.get("tools")
        if tools is not None and not (isinstance(tools, list) and all(
                isinstance(t, dict) and isinstance(t.get("function", {}), dict)
                for t in tools)):
            raise _bad("'tools' must be a list of objects, each with a 'function' object",
                       "tools")
        for i, m in enumerate(messages):
            calls = m.get("tool_calls")
            if calls is not None and not (isinstance(calls, list) and all(
                    isinstance(c, dict) and isinstance(c.get("function", {}), dict)
                    for c in calls)):
                raise _bad(f"messages[{i}].tool_calls must be a list of objects, each with "
                           "a 'function' object", "messages")
        if body.get("tool_choice") == "none":
            tools = None
        if self.tokenizer.chat_template is None:
            raise _bad("this model has no chat template: use /v1/completions", "messages")
        try:
            rendered = render_messages(self.tokenizer, messages, tools)
        except Exception as exc:  # the template's own complaint, e.g. roles out of order
            raise _bad(f"the chat template cannot render these messages: {exc}",
                       "messages") from exc
        try:
            plan = session.plan(role, rendered, messages, tools)
        except ValueError as exc:  # text this tokenizer cannot encode
            raise _bad(str(exc), "messages") from exc
        sampling = self._sampling(body, len(plan.prompt_ids), bool(tools))
        generations = await self._generate(session, role, plan, sampling)
        turn = ChatTurn(role, plan, generations)
        for gen in generations:
            text = self._text(gen, sampling["stops"])
            parsed = parse_tool_calls(self.parser, text, tools)
            turn.finish.append("tool_calls" if parsed.calls else gen.finish_reason)
            turn.stopped_by.append(next((s for s in sampling["stops"]
                                         if gen.finish_reason == "stop" and
                                         s in self.tokenizer.decode(gen.token_ids)), None))
            message: dict[str, Any] = {"role": "assistant",
                                       "content": parsed.content if parsed.content or
                                       not parsed.calls else None}
            if parsed.calls:
                message["tool_calls"] = parsed.calls
            turn.replies.append(message)
        session.record(role, plan, generations, messages, turn.replies)
        session.final_text = content_text(turn.replies[0]["content"])
        return turn

    async def _responses(self, session: Session, body: dict[str, Any]) -> Any:
        previous = body.get("previous_response_id")
        if previous is not None and not isinstance(previous, str):
            raise _bad("'previous_response_id' must be a string", "previous_response_id")
        if previous is not None and previous not in session.responses:
            raise GatewayError(404, f"no response {previous!r} in this rollout (a response "
                               "is kept until its rollout ends)", "previous_response_id",
                               kind="not_found_error")
        try:
            chat, convo = responses_api.to_chat(
                body, None if previous is None else session.responses[previous])
        except responses_api.ResponsesError as exc:
            raise _bad(str(exc), exc.param) from exc
        turn = await self.chat_turn(session, chat)
        reply = turn.replies[0]
        response_id = f"resp_{uuid.uuid4().hex}"
        session.responses[response_id] = [*convo, reply]
        resp = responses_api.response(body, turn.role, reply, turn.finish[0],
                                      len(turn.plan.prompt_ids),
                                      len(turn.generations[0].token_ids), response_id)
        if body.get("stream"):
            return _events(responses_api.stream_events(resp), done=False)
        return _json(resp)

    async def _messages(self, session: Session, body: dict[str, Any]) -> Any:
        try:
            chat = messages_api.to_chat(body)
        except messages_api.MessagesError as exc:
            raise _bad(str(exc), exc.param) from exc
        turn = await self.chat_turn(session, chat)
        msg = messages_api.message(turn.role, turn.replies[0], turn.finish[0],
                                   turn.stopped_by[0], len(turn.plan.prompt_ids),
                                   len(turn.generations[0].token_ids))
        if body.get("stream"):
            return _events(messages_api.stream_events(msg), done=False)
        return _json(msg)

    async def _count_tokens(self, session: Session, body: dict[str, Any]) -> Any:
        """``POST /v1/messages/count_tokens``: the prompt's tokens as the engine would
        see them (the request's messages, system and tools rendered by the template)."""
        try:
            chat = messages_api.to_chat({**body, "max_tokens": 1})
        except messages_api.MessagesError as exc:
            raise _bad(str(exc), exc.param) from exc
        self._role(session, chat)
        try:
            rendered = render_messages(self.tokenizer, chat["messages"], chat["tools"])
            count = len(self.tokenizer.encode(rendered))
        except Exception as exc:
            raise _bad(f"the chat template cannot render these messages: {exc}",
                       "messages") from exc
        return _json({"input_tokens": count})

    async def _completions(self, session: Session, body: dict[str, Any]) -> Any:
        role = self._role(session, body)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            raise _bad("'prompt' must be a non-empty string", "prompt")
        try:
            plan = session.plan(role, prompt, None)
        except ValueError as exc:
            raise _bad(str(exc), "prompt") from exc
        sampling = self._sampling(body, len(plan.prompt_ids), False)
        generations = await self._generate(session, role, plan, sampling)
        choices = []
        for index, gen in enumerate(generations):
            text = self._text(gen, sampling["stops"])
            logprobs = None
            if body.get("logprobs") is not None:
                tokens = [self.tokenizer.decode([t], skip_special_tokens=False)
                          for t in gen.token_ids]
                logprobs = {"tokens": tokens, "token_logprobs": list(gen.logprobs),
                            "top_logprobs": [{} for _ in tokens], "text_offset": []}
            choice: dict[str, Any] = {"index": index, "text": text,
                                      "finish_reason": gen.finish_reason, "logprobs": logprobs}
            if body.get("return_token_ids"):
                choice["token_ids"] = list(gen.token_ids)
            choices.append(choice)
        session.record(role, plan, generations, None, [None] * len(generations))
        session.final_text = choices[0]["text"]
        return self._reply("text_completion", role, choices, plan, generations, body)

    def _reply(self, kind: str, role: str, choices: list[dict[str, Any]], plan: Plan,
               generations: list[Generation], body: dict[str, Any]) -> Any:
        prefix = "chatcmpl" if kind == "chat.completion" else "cmpl"
        reply = {"id": f"{prefix}-{uuid.uuid4().hex}", "object": kind,
                 "created": int(time.time()), "model": role, "choices": choices,
                 "usage": self._usage(plan, generations)}
        if body.get("return_token_ids"):
            reply["prompt_token_ids"] = list(plan.prompt_ids)
        if body.get("stream"):
            return self._stream(reply, body)
        return _json(reply)

    @staticmethod
    def _usage(plan: Plan, generations: list[Generation]) -> dict[str, int]:
        done = sum(len(g.token_ids) for g in generations)
        return {"prompt_tokens": len(plan.prompt_ids), "completion_tokens": done,
                "total_tokens": len(plan.prompt_ids) + done}

    @staticmethod
    def _stream(reply: dict[str, Any], body: dict[str, Any]) -> Any:
        """Server-sent events of a finished answer, as the API streams one."""
        chat = reply["object"] == "chat.completion"
        base = {"id": reply["id"], "created": reply["created"], "model": reply["model"],
                "object": "chat.completion.chunk" if chat else "text_completion"}
        events = []
        for choice in reply["choices"]:
            i = choice["index"]
            if chat:
                message = choice["message"]
                deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
                if message.get("content"):
                    deltas.append({"content": message["content"]})
                if message.get("tool_calls"):
                    deltas.append({"tool_calls": [{"index": k, **call} for k, call in
                                                  enumerate(message["tool_calls"])]})
                for delta in deltas:
                    events.append({**base, "choices": [{"index": i, "delta": delta,
                                                        "logprobs": None,
                                                        "finish_reason": None}]})
                events.append({**base, "choices": [{"index": i, "delta": {},
                                                    "logprobs": choice["logprobs"],
                                                    "finish_reason": choice["finish_reason"]}]})
            else:
                events.append({**base, "choices": [choice]})
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append({**base, "choices": [], "usage": reply["usage"]})
        return _events(events)
