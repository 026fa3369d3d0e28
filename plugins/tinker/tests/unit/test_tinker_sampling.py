"""Sample requests batched together sample what each would have alone."""

from __future__ import annotations

import numpy as np
import pytest
from astraflow_tinker.engine import AdamParams, Datum, Engine, LoraSpec
from astraflow_tinker.sampling import SampleRequest

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def engine(chat_model_dir: str) -> Engine:
    engine = Engine(chat_model_dir)
    engine.create("t", LoraSpec(rank=8, seed=1))
    rows = np.random.default_rng(0).integers(0, 390, (4, 12))
    data = [Datum(r[:-1].tolist(), {"target_tokens": r[1:],
                                     "weights": np.ones(11, np.float32)}) for r in rows]
    for _ in range(3):  # an adapter that is not the base model's
        engine.forward_backward("t", data, "cross_entropy", {})
        engine.optim_step("t", AdamParams(learning_rate=1e-2))
    return engine


def requests() -> list[SampleRequest]:
    """Prompts of different lengths (left padding), sample counts and budgets."""
    rng = np.random.default_rng(1)
    out = [SampleRequest(rng.integers(0, 390, length).tolist(), n, max_tokens, seed)
           for length, n, max_tokens, seed in [(5, 1, 8, 11), (17, 3, 4, 12), (9, 2, 12, 13),
                                               (1, 1, 6, 14)]]
    # and a group's: the same prompt in requests of one sample each (one prefill)
    return out + [SampleRequest(out[2].prompt, 1, 5, seed) for seed in (21, 22)]


def test_a_batch_samples_what_each_request_would_alone(engine: Engine) -> None:
    batched = engine.sample_many("t", requests(), temperature=1.0, stop=[])
    for request, got in zip(requests(), batched, strict=True):
        alone, _ = engine.sample("t", request.prompt, request.num_samples,
                                 request.max_tokens, seed=request.seed, stop=[])
        assert [s.tokens for s in got] == [s.tokens for s in alone]
        assert all(len(s.tokens) == request.max_tokens for s in got)
        for mine, theirs in zip(got, alone, strict=True):
            np.testing.assert_allclose(mine.logprobs, theirs.logprobs, atol=1e-4)


def test_each_request_stops_at_its_own_stop(engine: Engine) -> None:
    """A stop token ends a row of the batch without ending the others."""
    free = engine.sample_many("t", requests(), temperature=1.0, stop=[])
    stop_token = free[2][0].tokens[3]  # request 2's first row has it at position 3
    stopped = engine.sample_many("t", requests(), temperature=1.0, stop=[stop_token])
    row = stopped[2][0]
    assert row.stop_reason == "stop" and row.tokens[-1] == stop_token
    assert len(row.tokens) <= 4
    for request, result in zip(requests(), stopped, strict=True):
        for s in result:
            assert s.stop_reason == "stop" or len(s.tokens) == request.max_tokens
