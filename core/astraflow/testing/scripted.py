"""A policy that answers from a script: pins down which tokens are whose in a workflow."""

from __future__ import annotations

from collections.abc import Callable

from astraflow.types import Generation


class ScriptedPolicy:
    """``reply(context_text)`` gives the completion to every prompt, as text (or a list
    of texts: sample ``i`` of a call gets entry ``i``).

    Replies are decided by the context, not by call order, so the concurrent attempts
    of a workflow get the same answers however they interleave. Every reply ends with
    the tokenizer's end token (``finish_reason`` "stop") unless ``end`` is False;
    log-probs are ``logprob`` and the version ``version``.
    """

    def __init__(self, name: str, tokenizer, reply: Callable[[str], str | list[str]], *,
                 end: bool = True, logprob: float = -0.5, version: int = 7) -> None:
        self.name, self.tokenizer, self.reply = name, tokenizer, reply
        self.end, self.logprob, self.version = end, logprob, version
        self.contexts: list[str] = []

    async def generate(self, prompt_ids, *, n=1, max_new_tokens=None, temperature=None,
                       stop_token_ids=None, top_p=1.0, seed=None) -> list[Generation]:
        context = self.tokenizer.decode(list(prompt_ids))
        self.contexts.append(context)
        replies = self.reply(context)
        if isinstance(replies, str):
            replies = [replies] * n
        out = []
        for i in range(n):
            ids = self.tokenizer.encode(replies[i])
            if self.end:
                ids.append(self.tokenizer.eos_token_id)
            out.append(Generation(ids, [self.logprob] * len(ids),
                                  "stop" if self.end else "length", self.version))
        return out
