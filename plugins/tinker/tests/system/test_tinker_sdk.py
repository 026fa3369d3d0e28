"""The official tinker SDK, unchanged, against ``astraflow tinker`` on a tiny local model:
training lowers the loss, samples carry the trainer's log-probabilities, two tenants
train at once without waiting for each other, a killed server comes back with the
tenants' saved states, and bad requests get the SDK's own errors."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tinker
from astraflow_tinker.testing import tinker_server
from tinker import types

ALICE, BOB = "tml-alice-0123456789", "tml-bob-0123456789"
NAME = "tiny-chat"
# short prompts of the chat model's vocabulary (ids under 400)
TEXT = [list(range(20 + i, 60 + i, 3)) for i in range(8)]


def server(model_dir: str, state: Path, port: int = 0):
    """``astraflow tinker`` as a user starts it, serving ``model_dir`` as :data:`NAME`."""
    return tinker_server(model_dir, state, [ALICE, BOB], name=NAME, port=port)


@pytest.fixture(scope="module")
def url(chat_model_dir, tmp_path_factory):
    state = tmp_path_factory.mktemp("tinker") / "state"
    state.mkdir()
    with server(chat_model_dir, state) as (address, _):
        yield address


def client(url: str, key: str = ALICE):
    return tinker.ServiceClient(base_url=url, api_key=key)


def sft_data(rows=TEXT) -> list:
    return [types.Datum(model_input=types.ModelInput.from_ints(r[:-1]),
                        loss_fn_inputs={"target_tokens": r[1:],
                                        "weights": [1.0] * (len(r) - 1)}) for r in rows]


def train_step(tc, data, lr=1e-2) -> float:
    fb = tc.forward_backward(data, "cross_entropy")
    tc.optim_step(types.AdamParams(learning_rate=lr)).result(timeout=120)
    return fb.result(timeout=120).metrics["loss:sum"]


def test_forward_backward_and_optim_step_lower_the_loss_on_a_fixed_batch(url):
    tc = client(url).create_lora_training_client(base_model=NAME, rank=8).result(timeout=120)
    info = tc.get_info()
    assert info.model_data.model_name == NAME and info.lora_rank == 8
    losses = [train_step(tc, sft_data()) for _ in range(6)]
    assert losses[-1] < 0.9 * losses[0] and losses[-1] < min(losses[1:-1]), losses
    # forward computes the loss without training: twice the same
    again = [tc.forward(sft_data(), "cross_entropy").result(timeout=60).metrics["loss:sum"]
             for _ in range(2)]
    assert again[0] == pytest.approx(again[1], rel=1e-6)


def test_a_custom_loss_written_in_torch_trains_through_the_sdk(url):
    """``forward_backward_custom``: the SDK runs the user's loss on the server's
    log-probabilities and sends its gradient back as cross-entropy weights."""
    import torch

    tc = client(url).create_lora_training_client(base_model=NAME, rank=8).result(timeout=120)

    def squared_nll(data, logprobs):  # a loss the server has no name for
        loss = sum((-lp).pow(2).sum() for lp in logprobs) / len(logprobs)
        return loss, {"squared_nll": float(loss.detach())}

    values = []
    for _ in range(4):
        out = tc.forward_backward_custom(sft_data(TEXT[:4]), squared_nll)
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result(timeout=120)
        values.append(out.result(timeout=120).metrics["squared_nll"])
    assert isinstance(values[0], float) and torch.isfinite(torch.tensor(values)).all()
    assert values[-1] < values[0], values


def test_a_sample_carries_the_trainers_log_probabilities(url):
    sc = client(url)
    tc = sc.create_lora_training_client(base_model=NAME, rank=8).result(timeout=120)
    train_step(tc, sft_data())
    sampler = tc.save_weights_and_get_sampling_client().result(timeout=60)
    prompt = TEXT[0][:6]
    out = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=3,
                         sampling_params=types.SamplingParams(max_tokens=8, temperature=1.0,
                                                              seed=7)).result(timeout=120)
    assert len(out.sequences) == 3
    for seq in out.sequences:
        assert seq.tokens and len(seq.logprobs) == len(seq.tokens)
        full = prompt + seq.tokens
        datum = types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                            loss_fn_inputs={"target_tokens": full[1:],
                                            "weights": [1.0] * (len(full) - 1)})
        learner = tc.forward([datum], "cross_entropy").result(timeout=60)
        lp = learner.loss_fn_outputs[0]["logprobs"].to_numpy()[len(prompt) - 1:]
        np.testing.assert_allclose(seq.logprobs, lp, atol=1e-3)
    # the same seed samples the same tokens
    again = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=3,
                           sampling_params=types.SamplingParams(max_tokens=8, temperature=1.0,
                                                                seed=7)).result(timeout=120)
    assert [s.tokens for s in again.sequences] == [s.tokens for s in out.sequences]


def test_two_tenants_train_at_once_neither_waiting_for_the_other(url):
    """Bob's client is slow (its environment takes a second between steps); Alice's
    steps go on meanwhile: no barrier holds her to his pace."""
    alice = client(url, ALICE).create_lora_training_client(base_model=NAME, rank=8)
    bob = client(url, BOB).create_lora_training_client(base_model=NAME, rank=8)
    alice, bob = alice.result(timeout=120), bob.result(timeout=120)
    done: dict[str, list[float]] = {"alice": [], "bob": []}

    def run(name, tc, steps, pause, rows):
        for _ in range(steps):
            train_step(tc, sft_data(rows))
            done[name].append(time.monotonic())
            time.sleep(pause)

    threads = [threading.Thread(target=run, args=("alice", alice, 5, 0.0, TEXT[:4])),
               threading.Thread(target=run, args=("bob", bob, 2, 1.5, TEXT[4:]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert len(done["alice"]) == 5 and len(done["bob"]) == 2
    # all of Alice's steps ended before Bob's second: none waited for his pace
    assert done["alice"][-1] < done["bob"][1], done
    # each samples its own weights: the same sequence scores differently
    prompt = types.ModelInput.from_ints(TEXT[0][:10])
    scores = [tc.save_weights_and_get_sampling_client().result(timeout=60)
              .compute_logprobs(prompt)
              .result(timeout=60) for tc in (alice, bob)]
    assert not np.allclose(scores[0][1:], scores[1][1:], atol=1e-4)


def test_bad_requests_get_the_sdks_own_errors(url):
    sc = client(url)
    with pytest.raises(tinker.BadRequestError, match="not served"):
        sc.create_lora_training_client(base_model="no/such-model", rank=8).result(timeout=60)
    tc = sc.create_lora_training_client(base_model=NAME, rank=8).result(timeout=120)
    wrong = [types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3]),
                         loss_fn_inputs={"target_tokens": [2, 3], "weights": [1.0, 1.0]})]
    with pytest.raises(tinker.BadRequestError, match="must be \\[3\\]"):
        tc.forward_backward(wrong, "cross_entropy").result(timeout=60)
    path = tc.save_weights_for_sampler("mine").result(timeout=60).path
    # Bob asks for Alice's weights: refused, as is an unknown path and a wrong key
    with pytest.raises(tinker.PermissionDeniedError):
        client(url, BOB).create_sampling_client(model_path=path).result(timeout=60)
    with pytest.raises(tinker.NotFoundError):
        sc.create_sampling_client(model_path=path.replace("mine", "never-saved")).result(
            timeout=60)
    with pytest.raises(tinker.AuthenticationError):
        client(url, "tml-not-a-key-here").create_lora_training_client(
            base_model=NAME, rank=8).result(timeout=60)
    # an unknown loss fails the operation with the SDK's own failure, naming the losses
    with pytest.raises(tinker.RequestFailedError, match="cross_entropy"):
        tc.forward_backward(sft_data(), "no_such_loss").result(timeout=60)


def test_a_killed_server_comes_back_with_the_tenants_saved_states(chat_model_dir, tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    rows = sft_data(TEXT[:4])
    with server(chat_model_dir, state) as (url, proc):
        port = int(url.rsplit(":", 1)[1])
        tc = client(url).create_lora_training_client(base_model=NAME, rank=8).result(
            timeout=120)
        losses = [train_step(tc, rows) for _ in range(3)]
        saved = tc.save_state("after-3").result(timeout=60).path
        at_save = tc.forward(rows, "cross_entropy").result(timeout=60).metrics["loss:sum"]
        train_step(tc, rows)  # a step after the save, lost with the server
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    with server(chat_model_dir, state, port=port) as (url, _):
        # a new client loads the saved state, optimizer included, and trains on
        sc = client(url)
        resumed = sc.create_training_client_from_state_with_optimizer(saved).result(
            timeout=120)
        loss = resumed.forward(rows, "cross_entropy").result(timeout=60).metrics["loss:sum"]
        assert loss == pytest.approx(at_save, rel=1e-5)
        after = [train_step(resumed, rows) for _ in range(2)]
        assert after[-1] < losses[0]
        # the old client's model is back at its last saved state, and it trains on too
        back = tc.forward(rows, "cross_entropy").result(timeout=120).metrics["loss:sum"]
        assert back == pytest.approx(at_save, rel=1e-5)


def test_malformed_payloads_get_a_4xx_that_says_what_is_wrong(url):
    """What no SDK sends, sent anyway: a 4xx naming the fault, never a 5xx."""
    import httpx

    headers = {"X-API-Key": ALICE}
    session = httpx.post(f"{url}/api/v1/create_session", headers=headers, json={}).json()
    cases = [
        ("create_model", b"not json", "not JSON"),
        ("create_model", b"[1, 2]", "JSON object"),
        ("create_model", {"session_id": session["session_id"], "base_model": NAME,
                          "lora_config": {"rank": "eight"}}, "rank"),
        ("create_model", {"session_id": session["session_id"], "base_model": NAME,
                          "model_seq_id": -1}, "model_seq_id"),
        ("forward_backward", b"\x00\xff garbage", "ForwardBackwardRequest"),
        ("optim_step", {"model_id": "nobody:train:0", "adam_params": {}}, "no model"),
        ("asample", {"sampling_session_id": "nothing", "prompt": {"chunks": []}},
         "no sampler"),
        ("create_sampling_session", {"session_id": session["session_id"],
                                     "base_model": NAME}, None),
    ]
    for path, body, says in cases:
        if says is None:  # a request that succeeds, to have a sampler to send garbage to
            sampler = httpx.post(f"{url}/api/v1/{path}", headers=headers, json=body).json()
            continue
        content = {"content": body} if isinstance(body, bytes) else {"json": body}
        kind = ("application/x-protobuf" if path == "forward_backward"
                else "application/json")
        answer = httpx.post(f"{url}/api/v1/{path}", headers={**headers, "content-type": kind},
                            **content)
        assert 400 <= answer.status_code < 500, (path, answer.status_code, answer.text)
        assert says in answer.json()["detail"], (path, answer.text)
    sampler_id = sampler["sampling_session_id"]
    for params, says in [("hot", "sampling_params"), ({"temperature": "hot"}, "temperature"),
                         ({"max_tokens": 10**9}, "max_tokens"), ({"seed": 1.5}, "seed")]:
        answer = httpx.post(f"{url}/api/v1/asample", headers=headers, json={
            "sampling_session_id": sampler_id, "num_samples": 1, "sampling_params": params,
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": [5, 6]}]}})
        assert answer.status_code == 400 and says in answer.json()["detail"], answer.text
    # no key at all, and a body over the limit
    assert httpx.post(f"{url}/api/v1/create_session", json={}).status_code == 401
    big = httpx.post(f"{url}/api/v1/create_session", headers=headers,
                     content=b"x" * (65 << 20))
    assert big.status_code == 413
