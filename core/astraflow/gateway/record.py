"""Token-exact recording of an agent's calls: what is trained is what was sampled.

An agent sends text (chat messages) and gets text back; the node renders the messages
to token ids, samples, and records the prompt ids, the sampled ids, their log-probs and
weight version. The next call of a multi-turn agent sends the whole conversation again
-- earlier messages, the assistant's reply, tool results. Rendering that history from
text again could give other tokens than the ones sampled (a reply that tokenizes
differently, a template that rewrites it), and training on those is the classic drift
of OpenAI-compatible gateways. So a call that *extends* an earlier one reuses that
call's recorded tokens as its prefix and renders only what is new:

1. by text: the earlier sequence, decoded with its special tokens, is a prefix of the
   new rendering -- the new ids are the recorded ones plus the rest, tokenized alone;
2. by messages: the earlier messages plus the reply the gateway returned are the first
   messages of the new call, but the template writes the reply otherwise (a tool call
   re-serialised, say) -- the recorded ids stay, the template's end of that turn and the
   new messages follow.

A call that extends nothing (a history rewritten or truncated by the agent) starts a
new *segment*, and is counted. Each segment is one token sequence of one model name
(policy): its sampled tokens train that policy, everything else in it is context.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from astraflow.trajectory import TrajectoryBuilder
from astraflow.types import Generation, RewardOutcome, Task, Trajectory


def canonical(messages: list[dict[str, Any]]) -> list[tuple]:
    """Messages as compared for extension: role, text and tool calls, ids ignored."""
    out = []
    for m in messages:
        calls = []
        for call in m.get("tool_calls") or []:
            fn = call.get("function", call)
            args = fn.get("arguments")
            if isinstance(args, str):
                with contextlib.suppress(ValueError):
                    args = json.loads(args)
            calls.append((fn.get("name"), json.dumps(args, sort_keys=True)))
        out.append((m.get("role"), content_text(m.get("content")), tuple(calls)))
    return out


def content_text(content: Any) -> str:
    """A message's content as text (OpenAI content parts are joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


@dataclass
class Segment:
    """One growing token sequence of one model name."""

    role: str
    builder: TrajectoryBuilder
    #: the sequence as text, special tokens included (what a re-rendering must start with)
    text: str
    #: the messages of its last call plus the reply returned (None for /v1/completions)
    messages: list[tuple] | None
    #: the last call's sampled ids
    last_ids: list[int]
    revision: int = 0
    calls: int = 0
    last_call: int = 0


@dataclass
class Plan:
    """How one call's prompt is made: extend ``base`` (None: a new segment) with
    ``suffix`` rendered text."""

    base: Segment | None
    suffix: str
    prompt_ids: list[int]
    revision: int


@dataclass
class Session:
    """One rollout: its key, its task, the model names it may call and its segments."""

    key: str
    task: Task
    group_id: str
    sample: int
    policies: dict[str, Any]
    tokenizer: Any
    segments: list[Segment] = field(default_factory=list)
    calls: int = 0
    #: calls whose messages extended no earlier call of their model
    restarts: int = 0
    #: the last reply's text (what the task's reward scores when the agent gives none)
    final_text: str = ""
    #: Responses API: each response's conversation (its instructions left out), what a
    #: call naming it as ``previous_response_id`` continues
    responses: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    # -- planning a call -------------------------------------------------------------
    def plan(self, role: str, rendered: str, messages: list[dict[str, Any]] | None,
             tools: list[dict[str, Any]] | None = None) -> Plan:
        tok = self.tokenizer
        mine = [s for s in self.segments if s.role == role]
        by_text = [s for s in mine if rendered.startswith(s.text)]
        if by_text:
            base = max(by_text, key=lambda s: len(s.text))
            return self._extend(base, rendered[len(base.text):])
        if messages is not None:
            wanted = canonical(messages)
            for base in sorted(mine, key=lambda s: -len(s.builder.tokens)):
                if base.messages is None or wanted[: len(base.messages)] != base.messages:
                    continue
                suffix = self._suffix_by_messages(base, messages, rendered, tools)
                if suffix is not None:
                    return self._extend(base, suffix)
        if mine:
            self.restarts += 1
        return Plan(None, rendered, tok.encode(rendered), 0)

    def _extend(self, base: Segment, suffix: str) -> Plan:
        ids = [*base.builder.tokens, *self.tokenizer.encode(suffix)] if suffix else \
            list(base.builder.tokens)
        return Plan(base, suffix, ids, base.revision)

    def _suffix_by_messages(self, base: Segment, messages: list[dict[str, Any]],
                            rendered: str, tools: list[dict[str, Any]] | None) -> str | None:
        """The text after the recorded tokens: the template's end of the reply's turn
        (e.g. ``<|im_end|>\\n`` after a reply that stopped at ``<|im_end|>``), then the new
        messages. None when the template does not render the history as a prefix."""
        tok = self.tokenizer
        count = len(base.messages or [])
        history = _with_dict_arguments(messages[:count])
        tools = tools or None
        with_reply = tok.render_chat(history, add_generation_prompt=False, tools=tools)
        if not rendered.startswith(with_reply):
            return None
        before = tok.render_chat(history[:-1], add_generation_prompt=True, tools=tools)
        reply = with_reply[len(before):] if with_reply.startswith(before) else ""
        sampled = tok.decode(base.last_ids, skip_special_tokens=False)
        if reply.startswith(sampled):
            closing = reply[len(sampled):]
        else:
            stops = [tok.decode([i], skip_special_tokens=False) for i in tok.stop_token_ids]
            ended = bool(base.last_ids) and base.last_ids[-1] in tok.stop_token_ids
            found = [(reply.rfind(s), s) for s in stops if s and s in reply]
            if found:
                pos, stop = max(found)
                closing = reply[pos + len(stop):] if ended else reply[pos:]
            else:
                closing = ""
        return closing + rendered[len(with_reply):]

    # -- recording what was sampled --------------------------------------------------
    def record(self, role: str, plan: Plan, generations: list[Generation],
               messages: list[dict[str, Any]] | None,
               replies: Sequence[dict[str, Any] | None]) -> None:
        """Each choice extends the plan's segment (the first, when nothing else has
        extended it meanwhile) or forks a copy of it."""
        tok = self.tokenizer
        self.calls += 1
        suffix_ids = plan.prompt_ids[len(plan.base.builder.tokens):] if plan.base else \
            plan.prompt_ids
        for index, (gen, reply) in enumerate(zip(generations, replies, strict=True)):
            base = plan.base
            builder = base.builder.copy() if base else TrajectoryBuilder(
                self.task.task_id, self.group_id)
            builder.add_context(suffix_ids)
            builder.add_generation(role, gen)
            convo = None
            if messages is not None and reply is not None:
                convo = canonical([*messages, reply])
            text = tok.decode(builder.tokens, skip_special_tokens=False)
            in_place = (base is not None and index == 0 and base.revision == plan.revision)
            if in_place and base is not None:
                base.builder, base.text, base.messages = builder, text, convo
                base.last_ids, base.revision = list(gen.token_ids), base.revision + 1
                base.calls += 1
                base.last_call = self.calls
            else:
                calls = (base.calls if base else 0) + 1
                self.segments.append(Segment(role, builder, text, convo, list(gen.token_ids),
                                             calls=calls, last_call=self.calls))

    # -- the rollout's trajectories --------------------------------------------------
    def trajectories(self, reward: float, metadata: dict[str, Any], credit: str = "final",
                     discount: float = 1.0, outcome: RewardOutcome | None = None
                     ) -> list[Trajectory]:
        """One trajectory per segment that sampled anything. ``credit``: ``final`` gives
        every segment the rollout's reward; ``discount`` gives a segment whose last call
        was k calls before the rollout's last ``reward * discount**k``. ``outcome``: how
        the rollout's reward went, told by each segment."""
        out = []
        for seg in self.segments:
            if not any(s == seg.role for s in seg.builder.sources):
                continue
            value = reward
            if credit == "discount":
                value = reward * discount ** (self.calls - seg.last_call)
            meta = {**metadata, "segment_calls": seg.calls, "rollout_reward": reward}
            out.append(seg.builder.build(seg.role, value, meta,
                                         None if outcome is None else copy.deepcopy(outcome)))
        return out


def _with_dict_arguments(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool-call arguments as dicts, as chat templates expect them (the OpenAI API sends
    them as JSON strings)."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("content") is not None and not isinstance(m["content"], str):
            m["content"] = content_text(m["content"])
        if m.get("tool_calls"):
            calls = []
            for call in m["tool_calls"]:
                call = dict(call)
                fn = dict(call.get("function") or {})
                if isinstance(fn.get("arguments"), str):
                    with contextlib.suppress(ValueError):
                        fn["arguments"] = json.loads(fn["arguments"])
                call["function"] = fn
                calls.append(call)
            m["tool_calls"] = calls
        out.append(m)
    return out


def render_messages(tokenizer: Any, messages: list[dict[str, Any]],
                    tools: list[dict[str, Any]] | None) -> str:
    return tokenizer.render_chat(_with_dict_arguments(messages), add_generation_prompt=True,
                                 tools=tools or None)
