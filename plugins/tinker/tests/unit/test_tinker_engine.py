"""The Tinker service's engine: LoRA tenants on a tiny real Qwen2 checkpoint."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import astraflow_tinker.engine as engine_module
import numpy as np
import pytest
import torch
from astraflow_tinker.engine import AdamParams, Datum, Engine, EngineError, LoraSpec

pytestmark = pytest.mark.unit

LR = AdamParams(learning_rate=1e-2)


@pytest.fixture(scope="module")
def engine(chat_model_dir: str) -> Engine:
    return Engine(chat_model_dir)


def sequence_datum(tokens: list[int]) -> Datum:
    """Next-token cross-entropy on ``tokens``, unit weights."""
    return Datum(tokens[:-1], {"target_tokens": np.array(tokens[1:]),
                               "weights": np.ones(len(tokens) - 1, np.float32)})


def batch(seed: int, n: int = 3, length: int = 10) -> list[Datum]:
    rng = np.random.default_rng(seed)
    return [sequence_datum(rng.integers(0, 390, length + 1).tolist()) for _ in range(n)]


def logprobs(engine: Engine, tenant: str, data: list[Datum]) -> np.ndarray:
    lps, _ = engine.forward_backward(tenant, data, "cross_entropy", {}, forward_only=True)
    return np.concatenate(lps)


def train(engine: Engine, tenant: str, data: list[Datum], steps: int = 1) -> None:
    for _ in range(steps):
        engine.forward_backward(tenant, data, "cross_entropy", {})
        engine.optim_step(tenant, LR)


def test_a_new_tenant_is_the_base_model_and_training_lowers_its_loss(engine: Engine) -> None:
    rng_state = torch.get_rng_state()
    engine.create("ce", LoraSpec(rank=8, seed=3))
    assert torch.equal(torch.get_rng_state(), rng_state)  # its seed is its own
    assert engine.spec("ce") == LoraSpec(rank=8, seed=3) and "ce" in engine.tenants()
    data = batch(0)
    _, base_lp = engine.sample(None, data[0].tokens, 1, 1, prompt_logprobs=True)
    np.testing.assert_allclose(logprobs(engine, "ce", data[:1])[:-1], base_lp[1:], atol=1e-5)
    losses = []
    for _ in range(4):
        lps, metrics = engine.forward_backward("ce", data, "cross_entropy", {})
        assert [len(lp) for lp in lps] == [10] * 3 and lps[0].dtype == np.float32
        losses.append(metrics["loss:sum"])
        step = engine.optim_step("ce", LR)
        assert set(step) == {"grad_norm:mean", "step:max"} and step["grad_norm:mean"] > 0
    assert step["step:max"] == 4.0
    assert losses == sorted(losses, reverse=True) and losses[-1] < losses[0] - 1
    assert engine.optim_step("ce", LR)["grad_norm:mean"] == 0.0  # nothing accumulated
    engine.drop("ce")
    assert "ce" not in engine.tenants()  # the other tests' tenants stay: names differ


def test_tenants_do_not_leak_into_each_other(engine: Engine, tmp_path: Path) -> None:
    for name in ("iso-a", "iso-b", "iso-b-alone"):
        engine.create(name, LoraSpec(rank=4, seed=1))
    data_a, data_b = batch(1), batch(2)
    engine.save_sampler("iso-a", tmp_path / "a0")
    engine.load_sampler("iso-a@0", tmp_path / "a0")
    prompt = data_a[0].tokens
    snapshot = engine.sample("iso-a@0", prompt, 1, 1, prompt_logprobs=True)[1]
    b_before = logprobs(engine, "iso-b", data_b)
    # interleaved: B's gradient waits while A trains twice
    engine.forward_backward("iso-b", data_b, "cross_entropy", {})
    train(engine, "iso-a", data_a, steps=2)
    np.testing.assert_array_equal(logprobs(engine, "iso-b", data_b), b_before)
    engine.optim_step("iso-b", LR)
    train(engine, "iso-b-alone", data_b)
    np.testing.assert_allclose(logprobs(engine, "iso-b", data_b),
                               logprobs(engine, "iso-b-alone", data_b), atol=1e-6)
    # the snapshot stays as saved; the tenant's name samples its current weights
    assert engine.sample("iso-a@0", prompt, 1, 1, prompt_logprobs=True)[1] == snapshot
    current = engine.sample("iso-a", prompt, 1, 1, prompt_logprobs=True)[1]
    np.testing.assert_allclose(current[1:], logprobs(engine, "iso-a", data_a[:1])[:-1],
                               atol=1e-5)
    assert current != snapshot


def test_gradients_accumulate_until_the_step(engine: Engine) -> None:
    engine.create("acc-two", LoraSpec(rank=4))
    engine.create("acc-one", LoraSpec(rank=4))
    first, second = batch(3), batch(4, n=2, length=7)
    l1 = engine.forward_backward("acc-two", first, "cross_entropy", {})[1]["loss:sum"]
    logprobs(engine, "acc-two", second)  # a forward_only call leaves the gradient alone
    l2 = engine.forward_backward("acc-two", second, "cross_entropy", {})[1]["loss:sum"]
    both = engine.forward_backward("acc-one", first + second, "cross_entropy", {})[1]
    assert both["loss:sum"] == pytest.approx(l1 + l2, rel=1e-6)
    clip = AdamParams(learning_rate=1e-2, grad_clip_norm=1.0, weight_decay=0.1)
    norm_two = engine.optim_step("acc-two", clip)["grad_norm:mean"]
    assert engine.optim_step("acc-one", clip)["grad_norm:mean"] == pytest.approx(norm_two)
    np.testing.assert_allclose(logprobs(engine, "acc-two", first + second),
                               logprobs(engine, "acc-one", first + second), atol=1e-5)


def test_a_big_request_is_split_into_forwards_with_the_same_result(
        engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    engine.create("micro-1", LoraSpec(rank=4))
    engine.create("micro-n", LoraSpec(rank=4))
    data = batch(16, n=3, length=6) + batch(17, n=2, length=9)
    whole = engine.forward_backward("micro-n", data, "cross_entropy", {})
    monkeypatch.setattr(engine_module, "MICRO_SEQS", 2)
    monkeypatch.setattr(engine_module, "MICRO_TOKENS", 12)
    assert list(engine._micro_batches([6] * 3 + [9] * 2)) == [(0, 2), (2, 3), (3, 4), (4, 5)]
    split = engine.forward_backward("micro-1", data, "cross_entropy", {})
    assert split[1]["loss:sum"] == pytest.approx(whole[1]["loss:sum"], rel=1e-6)
    for a, b in zip(split[0], whole[0], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert engine.optim_step("micro-1", LR) == pytest.approx(engine.optim_step("micro-n", LR))


def test_each_loss_is_its_formula_summed(engine: Engine) -> None:
    engine.create("loss", LoraSpec(rank=4))
    data = batch(5, n=2)
    lp, rng = logprobs(engine, "loss", data), np.random.default_rng(0)
    for d in data:
        d.inputs["logprobs"] = (rng.normal(0, 0.5, 10) - 6).astype(np.float32)
        d.inputs["advantages"] = rng.normal(0, 1, 10).astype(np.float32)
        d.inputs["weights"] = rng.uniform(-1, 2, 10).astype(np.float32)
    q, a, w = (np.concatenate([d.inputs[k] for d in data])
               for k in ("logprobs", "advantages", "weights"))
    r = np.exp(lp - q)
    expected = {
        "cross_entropy": ({}, -(lp * w).sum()),
        "importance_sampling": ({}, -(r * a).sum()),
        "ppo": ({"clip_high_threshold": 1.1},
                -np.minimum(r * a, np.clip(r, 0.8, 1.1) * a).sum()),
        "cispo": ({}, -(np.clip(r, 0.0, 4.0) * lp * a).sum()),
        "dro": ({"beta": 0.5}, -(lp * a - 0.25 * (lp - q) ** 2).sum()),
    }
    for name, (config, value) in expected.items():
        _, metrics = engine.forward_backward("loss", data, name, config, forward_only=True)
        assert metrics["loss:sum"] == pytest.approx(value, rel=1e-4), name
    with pytest.raises(EngineError, match="'dro' needs 'beta'"):
        engine.forward_backward("loss", data, "dro", {})


def test_a_saved_state_resumes_in_a_new_engine(engine: Engine, chat_model_dir: str,
                                               tmp_path: Path) -> None:
    engine.create("ckpt", LoraSpec(rank=4, seed=7, train_mlp=False))
    data, later = batch(6), batch(7)
    train(engine, "ckpt", data, steps=2)
    engine.save_state("ckpt", tmp_path / "state")
    engine.save_state("ckpt", tmp_path / "state")  # over an existing one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state"]  # no temporary left
    saved = logprobs(engine, "ckpt", later)
    fresh = Engine(chat_model_dir)
    fresh.load_sampler("snap", tmp_path / "state")  # a state is a peft adapter too
    snap = fresh.sample("snap", later[0].tokens, 1, 1, prompt_logprobs=True)[1]
    np.testing.assert_allclose(snap[1:], saved[:9], atol=1e-5)
    fresh.load_state("ckpt", tmp_path / "state", optimizer=True)
    fresh.load_state("weights-only", tmp_path / "state", optimizer=False)
    assert fresh.spec("ckpt") == engine.spec("ckpt")
    np.testing.assert_array_equal(logprobs(fresh, "ckpt", later), saved)
    steps = {}
    for e, name in ((engine, "ckpt"), (fresh, "ckpt"), (fresh, "weights-only")):
        e.forward_backward(name, later, "cross_entropy", {})
        steps[name if e is fresh else "orig"] = (e.optim_step(name, LR), logprobs(e, name, data))
    assert steps["ckpt"][0] == steps["orig"][0] and steps["ckpt"][0]["step:max"] == 3.0
    np.testing.assert_array_equal(steps["ckpt"][1], steps["orig"][1])
    assert steps["weights-only"][0]["step:max"] == 1.0  # the moments started again
    assert np.abs(steps["weights-only"][1] - steps["orig"][1]).max() > 1e-3
    # loading into an existing tenant replaces its weights and moments
    fresh.load_state("weights-only", tmp_path / "state", optimizer=True)
    np.testing.assert_array_equal(logprobs(fresh, "weights-only", later), saved)
    fresh.forward_backward("weights-only", later, "cross_entropy", {})
    assert fresh.optim_step("weights-only", LR) == steps["ckpt"][0]


def test_load_state_refuses_what_is_not_a_state(engine: Engine, tmp_path: Path) -> None:
    engine.create("keep", LoraSpec(rank=2))
    train(engine, "keep", batch(8))
    before = logprobs(engine, "keep", batch(9))
    engine.save_sampler("keep", tmp_path / "sampler")
    engine.save_state("keep", tmp_path / "weights", optimizer=False)
    (tmp_path / "empty").mkdir()
    for where, match in (("empty", "not a saved training state"),
                         ("sampler", "not a saved training state"),
                         ("weights", "saved without optimizer state")):
        with pytest.raises(EngineError, match=match) as err:
            engine.load_state("keep", tmp_path / where, optimizer=True)
        assert str(tmp_path / where) in str(err.value)
    meta = json.loads((tmp_path / "weights" / "tinker_state.json").read_text())
    meta["base_config_sha256"] = "0" * 64
    (tmp_path / "weights" / "tinker_state.json").write_text(json.dumps(meta))
    with pytest.raises(EngineError, match="another base model"):
        engine.load_state("keep", tmp_path / "weights", optimizer=False)
    np.testing.assert_array_equal(logprobs(engine, "keep", batch(9)), before)
    assert engine.tenants().count("keep") == 1


def test_a_saved_sampler_is_a_peft_adapter(engine: Engine, chat_model_dir: str,
                                           tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    engine.create("peft", LoraSpec(rank=4))
    data = batch(10, n=1)
    train(engine, "peft", data, steps=2)
    engine.save_sampler("peft", tmp_path / "adapter")
    assert {p.name for p in (tmp_path / "adapter").iterdir()} == {
        "adapter_config.json", "adapter_model.safetensors"}
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], len(config["target_modules"])) == (4, 32, 7)
    assert "lm_head" not in config["target_modules"]  # tied to the input embedding
    base = AutoModelForCausalLM.from_pretrained(chat_model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(tmp_path / "adapter")).eval()
    ids = torch.tensor([data[0].tokens])
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=ids).logits[0], -1)
    expected = lp.gather(-1, torch.as_tensor(data[0].inputs["target_tokens"])[:, None])
    np.testing.assert_allclose(logprobs(engine, "peft", data), expected[:, 0].numpy(),
                               atol=1e-5)


def test_sampled_logprobs_are_the_learners(engine: Engine) -> None:
    engine.create("smp", LoraSpec(rank=4))
    train(engine, "smp", batch(11), steps=2)
    prompt = batch(12)[0].tokens
    samples, prompt_lp = engine.sample("smp", prompt, 3, 12, stop=[], seed=0,
                                       prompt_logprobs=True)
    assert prompt_lp is not None and prompt_lp[0] is None and len(prompt_lp) == len(prompt)
    for s in samples:
        assert len(s.tokens) == len(s.logprobs) == 12 and s.stop_reason == "length"
        lp = logprobs(engine, "smp", [sequence_datum(prompt + s.tokens)])
        np.testing.assert_allclose(lp[len(prompt) - 1:], s.logprobs, atol=1e-4)
        np.testing.assert_allclose(lp[:len(prompt) - 1], prompt_lp[1:], atol=1e-4)


def test_sampling_is_reproducible_by_seed(engine: Engine) -> None:
    prompt = batch(13)[0].tokens

    def tokens(**kw: object) -> list[list[int]]:
        return [s.tokens for s in engine.sample(None, prompt, 4, 8, stop=[], **kw)[0]]

    assert tokens(seed=1) == tokens(seed=1) != tokens(seed=2)
    greedy = tokens(temperature=0.0)
    assert all(row == greedy[0] for row in greedy)
    assert tokens(seed=3, top_k=1) == greedy == tokens(seed=4, top_p=1e-6)
    top3 = tokens(seed=5, top_k=3, temperature=2.0)
    assert len({t for row in top3 for t in row}) > 1


def test_stop_tokens_and_stop_strings_end_a_sample(engine: Engine) -> None:
    prompt = batch(14)[0].tokens
    (free,), _ = engine.sample(None, prompt, 1, 16, stop=[], seed=0)
    stop_id = free.tokens[3]
    (stopped,), _ = engine.sample(None, prompt, 1, 16, stop=[stop_id, 10**6], seed=0)
    assert stopped.stop_reason == "stop" and stopped.tokens[-1] == stop_id
    assert stopped.tokens == free.tokens[:free.tokens.index(stop_id) + 1]
    texts = [engine.tokenizer.decode(free.tokens[:i + 1]) for i in range(16)]
    needle = next(t[-2:] for t in texts[2:] if len(t) > 2 and "\ufffd" not in t[-2:])
    end = next(i for i, text in enumerate(texts) if needle in text)
    (by_text,), _ = engine.sample(None, prompt, 1, 16, stop=[needle], seed=0)
    assert by_text.stop_reason == "stop" and by_text.tokens == free.tokens[:end + 1]
    (greedy,), _ = engine.sample(None, prompt, 1, 4, temperature=0, stop=[])
    first = engine.sample(None, prompt, 2, 16, temperature=0, stop=[greedy.tokens[0]])[0]
    assert [s.tokens for s in first] == [greedy.tokens[:1]] * 2


def test_bad_requests_raise_engine_errors(engine: Engine, chat_model_dir: str) -> None:
    engine.create("bad", LoraSpec(rank=2))
    good = batch(15, n=2)
    short = [good[0], Datum(good[1].tokens, {**good[1].inputs, "target_tokens": np.arange(7)})]
    fb = functools.partial(engine.forward_backward, "bad")
    cases = [
        (lambda: fb(short, "cross_entropy", {}),
         "datum 1: target_tokens has shape \\(7,\\), model_input 10 tokens"),
        (lambda: fb(good, "ppo", {}), "datum 0: loss_fn_inputs has no 'logprobs'"),
        (lambda: fb(good, "mse", {}), "not one of cross_entropy"),
        (lambda: fb(good, "cross_entropy", {"beta": 1.0}), "\\['beta'\\] is not read"),
        (lambda: fb([Datum([400], good[0].inputs)], "cross_entropy", {}), "datum 0: model_input"),
        (lambda: engine.optim_step("nobody", LR), "unknown tenant 'nobody'"),
        (lambda: engine.create("bad", LoraSpec()), "exists"),
        (lambda: engine.create("zero", LoraSpec(rank=0)), "rank=0"),
        (lambda: engine.optim_step("bad", AdamParams(beta1=1.0)), "adam_params"),
        (lambda: engine.sample("ghost", [1, 2], 1, 4), "unknown sampler 'ghost'"),
        (lambda: engine.sample(None, [1] * 1020, 1, 8), "1024-token context"),
        (lambda: engine.sample(None, [1, 2], 1, 4, stop=[1, "x"]), "not both"),
        (lambda: Engine(chat_model_dir, max_tenants=0).create("x", LoraSpec()), "maximum"),
    ]
    for call, match in cases:
        with pytest.raises(EngineError, match=match):
            call()
