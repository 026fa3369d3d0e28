"""raas=hf passes the shared rollout-backend contract on CPU with a real tiny model."""

from astraflow.testing.rollout import RolloutBackendContract


class TestHFRolloutContract(RolloutBackendContract):
    backend_name = "hf"

    def test_a_swap_lands_between_two_decode_steps(self, engine, tiny_model_dir, tmp_path):
        """The swap waits for no generation: one under way takes the new weights at its
        next step. Its tokens before that are exactly what the old weights sample alone
        (greedy), and are labelled old; the rest are labelled new."""
        from astraflow.testing.rollout import LONG, perturbed_copy

        loop, backend = engine
        old = backend.version
        alone = loop.run(backend.generate(self._req(
            tiny_model_dir, "12+30=", temperature=0.0, max_new_tokens=LONG,
            stop_token_ids=[0])))[0]
        noisy = perturbed_copy(tiny_model_dir, tmp_path / "noisy", scale=0.05)
        # under way: a decode step taken (the engine merely busy may not have sampled
        # yet, and a swap before the first token takes every token new)
        steps = backend.decode_steps
        gen, order = loop.run(self._swap_during(
            backend, tiny_model_dir, noisy, old + 1,
            started=lambda: backend.decode_steps > steps))
        versions = gen.versions()
        switch = versions.index(old + 1)
        assert order == ["swap", "generation"]
        assert 0 < switch < LONG and gen.version == old
        assert versions == [old] * switch + [old + 1] * (LONG - switch)
        assert gen.token_ids[:switch] == alone.token_ids[:switch]
        assert gen.logprobs[:switch] == alone.logprobs[:switch]
        assert gen.token_ids != alone.token_ids  # the new weights sampled the rest


def test_samples_of_one_prompt_share_its_prefill(tiny_model_dir):
    """``raas.shared_prefix``: a prompt's samples are prefilled once and generate what
    they generate without it (greedy: the same tokens and log-probs), prompts of other
    lengths beside them in the batch; sampled, they are still each their own."""
    import functools

    import pytest

    from astraflow.plugins import get_registry
    from astraflow.testing.engine import LoopThread
    from astraflow.testing.rollout import prompt_ids
    from astraflow.types import GenerationRequest

    entry = get_registry().get("rollout_backend", "hf")

    def run(shared: bool, temperature: float) -> list:
        config = entry.config_cls(shared_prefix=shared)
        backend = entry.create(config, tiny_model_dir)
        loop = LoopThread()
        loop.run(backend.start())
        try:
            requests = [GenerationRequest(prompt_ids=prompt_ids(tiny_model_dir, text), n=n,
                                          max_new_tokens=6, temperature=temperature, seed=0)
                        for text, n in (("12+7=", 4), ("3-9=", 1), ("123+45=", 3))]
            calls = {"n": 0}
            forward = backend.model.forward

            @functools.wraps(forward)  # generate reads the signature (position_ids)
            def counted(*args, **kwargs):
                calls["n"] += 1
                return forward(*args, **kwargs)

            backend.model.forward = counted
            out = backend._generate_batch(requests)  # one batch, on this thread
            return out, calls["n"]
        finally:
            loop.run(backend.shutdown())
            loop.close()

    (plain, plain_calls), (shared, shared_calls) = run(False, 0.0), run(True, 0.0)
    assert shared_calls == plain_calls + 1  # the prefill of the distinct prompts
    for want, got in zip(plain, shared, strict=True):
        for a, b in zip(want, got, strict=True):
            assert a.token_ids == b.token_ids
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    sampled, _ = run(True, 1.0)
    assert len({tuple(g.token_ids) for g in sampled[0]}) > 1


def test_auto_holds_a_checkpoint_in_its_own_dtype(tiny_model_dir, tmp_path):
    """``raas.dtype=auto``, the default: a checkpoint saved in bfloat16 (as releases are)
    is held in bfloat16, half the memory of float32; the float32 fixture stays float32,
    so the tiny runs serve as before; a dtype set explicitly wins."""
    import json

    import torch
    from transformers import AutoModelForCausalLM

    from astraflow.plugins import get_registry

    bf16 = tmp_path / "bf16"
    AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).save_pretrained(bf16)
    assert json.loads((bf16 / "config.json").read_text())["dtype"] == "bfloat16"
    entry = get_registry().get("rollout_backend", "hf")

    def held(path, **settings) -> set:
        backend = entry.create(entry.config_cls(**settings), str(path))
        try:
            return {p.dtype for p in backend._load().parameters()}
        finally:
            backend._executor.shutdown()

    assert entry.config_cls().dtype == "auto"
    assert held(bf16) == {torch.bfloat16}
    assert held(tiny_model_dir) == {torch.float32}
    assert held(bf16, dtype="float32") == {torch.float32}


def test_a_conversations_next_turn_reuses_its_last_turns_keys(chat_model_dir, tmp_path):
    """``raas.prefix_cache_gib``: a prompt that extends an earlier generation (history,
    the reply, a new turn) runs only its new tokens on that generation's kept cache, and
    samples what a cold engine samples (greedy: the same tokens, log-probs to rounding);
    new weights make the kept caches stale."""
    import random

    import pytest

    from astraflow.plugins import get_registry
    from astraflow.testing.engine import LoopThread
    from astraflow.testing.rollout import perturbed_copy
    from astraflow.types import GenerationRequest

    entry = get_registry().get("rollout_backend", "hf")
    rng = random.Random(0)
    first = [rng.randrange(3, 300) for _ in range(300)]
    later = [rng.randrange(3, 300) for _ in range(40)]

    def conversation(gib: float) -> tuple[list, object]:
        backend = entry.create(entry.config_cls(prefix_cache_gib=gib,
                                                prefix_cache_min_tokens=64), chat_model_dir)
        loop = LoopThread()
        loop.run(backend.start())
        try:
            out = []
            prompt = first
            for _ in range(3):
                (gen,) = loop.run(backend.generate(GenerationRequest(
                    prompt_ids=prompt, max_new_tokens=8, temperature=0.0)))
                out.append(gen)
                prompt = prompt + gen.token_ids + later
            if gib:
                hits = backend.prefixes.hits
                loop.run(backend.load_weights(str(perturbed_copy(
                    chat_model_dir, tmp_path / "new", scale=0.05)), backend.version + 1))
                loop.run(backend.generate(GenerationRequest(prompt_ids=prompt,
                                                            max_new_tokens=2)))
                assert backend.prefixes.hits == hits  # stale after new weights
            return out, backend.prefixes
        finally:
            loop.run(backend.shutdown())
            loop.close()

    warm, prefixes = conversation(0.5)
    cold, none = conversation(0.0)
    assert none is None and prefixes.hits == 2  # turns 2 and 3
    for a, b in zip(warm, cold, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_a_request_given_up_while_queued_is_not_generated(tiny_model_dir):
    """An over-provisioned group's sample cancelled while its request waits behind the
    batch under way costs the engine nothing: it is dropped from the next batch."""
    import asyncio

    from astraflow.plugins import get_registry
    from astraflow.testing.engine import LoopThread
    from astraflow.testing.rollout import LONG, prompt_ids
    from astraflow.types import GenerationRequest

    entry = get_registry().get("rollout_backend", "hf")
    backend = entry.create(entry.config_cls(), tiny_model_dir)
    loop = LoopThread()
    loop.run(backend.start())
    rows: list[int] = []
    generate_batch = backend._generate_batch

    def counted(requests):
        rows.append(sum(r.n for r in requests))
        return generate_batch(requests)

    backend._generate_batch = counted

    def request(n: int) -> GenerationRequest:
        return GenerationRequest(prompt_ids=prompt_ids(tiny_model_dir, "12+7="), n=n,
                                 max_new_tokens=LONG, temperature=1.0, stop_token_ids=[])

    async def scenario() -> int:
        first = asyncio.ensure_future(backend.generate(request(1)))
        while not rows:  # the first batch is under way
            await asyncio.sleep(0.001)
        given_up = asyncio.ensure_future(backend.generate(request(5)))
        kept = asyncio.ensure_future(backend.generate(request(2)))
        await asyncio.sleep(0)  # both queued behind it
        given_up.cancel()
        await first
        return len(await kept)

    try:
        assert loop.run(scenario()) == 2
        assert rows == [1, 2]  # the 5 rows given up were never generated
    finally:
        loop.run(backend.shutdown())
        loop.close()
