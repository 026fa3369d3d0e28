"""The recording's rules, on real tokenizers and real data structures (no engine)."""

from __future__ import annotations

from astraflow.gateway.record import Session, render_messages
from astraflow.gateway.tools import parse_tool_calls
from astraflow.rl.advantages import group_advantages
from astraflow.text import load_tokenizer
from astraflow.types import Generation, Task

CALC = {"type": "function", "function": {"name": "calc", "parameters": {
    "type": "object", "properties": {"expression": {"type": "string"}}}}}


def test_a_reply_the_template_writes_otherwise_is_kept_as_sampled(chat_model_dir):
    """Qwen's template re-serialises a tool call's JSON (spaces, key order): the text of the
    history no longer starts with what was sampled, so the messages decide, and the next
    prompt begins with the sampled ids themselves."""
    tok = load_tokenizer(chat_model_dir)
    session = Session("k", Task("t", "1+2="), "g", 0, {"policy": None}, tok)
    messages = [{"role": "user", "content": "1+2="}]
    rendered = tok.render_chat(messages, tools=[CALC])
    plan = session.plan("policy", rendered, messages, [CALC])
    assert plan.base is None
    im_end = tok.token_id("<|im_end|>")
    sampled = [*tok.encode('<tool_call>\n{"arguments":{"expression":"1+2"},"name":"calc"}'
                           '\n</tool_call>'), im_end]
    gen = Generation(sampled, [-0.5] * len(sampled), "stop", 3)
    parsed = parse_tool_calls("hermes", tok.decode(sampled), [CALC])
    reply = {"role": "assistant", "content": None, "tool_calls": parsed.calls}
    session.record("policy", plan, [gen], messages, [reply])
    recorded = list(session.segments[0].builder.tokens)

    history = [*messages, reply, {"role": "tool", "tool_call_id": parsed.calls[0]["id"],
                                  "content": "3"}]
    rendered = render_messages(tok, history, [CALC])
    assert not rendered.startswith(tok.decode(recorded, skip_special_tokens=False))
    plan = session.plan("policy", rendered, history, [CALC])
    assert plan.base is session.segments[0] and session.restarts == 0
    assert plan.prompt_ids[: len(recorded)] == recorded
    # after the sampled <|im_end|>: the template's newline, then the tool turn
    assert plan.suffix.startswith("\n<|im_start|>user\n<tool_response>\n3")
    assert plan.suffix.endswith("<|im_start|>assistant\n")


def test_discounted_credit_and_advantages_over_whole_rollouts(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    session = Session("k", Task("t", "1+1="), "g", 0, {"policy": None}, tok)
    for prompt in ("1+1=", "2+2=", "3+3="):  # three unrelated calls: three segments
        plan = session.plan("policy", prompt, None)
        ids = tok.encode("2")
        session.record("policy", plan, [Generation(ids, [-1.0], "stop", 0)], None, [None])
    assert session.restarts == 2
    trajs = session.trajectories(1.0, {"rollout": "g:0"}, credit="discount", discount=0.5)
    assert [t.reward for t in trajs] == [0.25, 0.5, 1.0]
    # one rollout of three segments (reward 1) and one of one segment (reward 0): the
    # baseline is the mean over rollouts (0.5), not over segments (0.75)
    advantages = group_advantages([1.0, 1.0, 1.0, 0.0], rollouts=["a", "a", "a", "b"])
    assert advantages[0] > 0 and advantages[3] < 0
    assert abs(advantages[0] + advantages[3]) < 1e-6
