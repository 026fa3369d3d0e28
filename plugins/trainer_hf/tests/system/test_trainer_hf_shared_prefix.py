"""``trainer.shared_prefix``: a group's prompt goes through the model once, and training
is the same as without: the same log-probs, metrics and weights after a step. And logits
computed only where tokens are trained train as all of them do."""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from astraflow_trainer_hf import HFConfig
from astraflow_trainer_hf.backend import HFTrainerBackend
from omegaconf import OmegaConf

from astraflow.rl import shared_prefix
from astraflow.rl.policy_gradient import micro_batches
from astraflow.tasks.arithmetic import ArithmeticTasks
from astraflow.testing.trainer import prompt_completion, with_behaviour_logprobs
from astraflow.text import load_tokenizer
from astraflow.types import Batch, TrainItem


def grouped_batch(model_dir: str, groups: int = 6, size: int = 5, seed: int = 0) -> Batch:
    """``groups`` prompts x ``size`` sampled-looking completions, as GRPO trains them.

    The completions of a group often start alike (so the group's common prefix reaches
    into trained tokens), one sometimes continues another, and the last group has a
    single member (its prefix is all but its last token); advantages are centred per
    group.
    """
    rng = random.Random(seed)
    tokenizer = load_tokenizer(model_dir)
    digits = [tokenizer.encode(str(d))[0] for d in range(10)]
    items = []
    tasks = list(ArithmeticTasks().eval_tasks())[:groups]
    for g, task in enumerate(tasks):
        prompt = tokenizer.encode(task.prompt)
        shared = [rng.choice(digits)] if g % 2 else []
        members = 1 if g == groups - 1 else size
        rewards = [float(rng.random() < 0.5) for _ in range(members)]
        mean = sum(rewards) / members
        for k in range(members):
            completion = shared + [rng.choice(digits) for _ in range(rng.randint(0, 4))]
            if k == 1 and g % 3 == 0:  # a completion that continues another one
                completion = [*items[-1].trajectory.tokens[len(prompt):-1],
                              rng.choice(digits)]
            trajectory = prompt_completion(task.task_id, prompt,
                                           [*completion, tokenizer.eos_token_id], rewards[k])
            items.append(TrainItem(trajectory, rewards[k] - mean))
    return Batch(batch_id=f"grouped-{seed}", policy="policy", items=items)


def backend(model_dir: str, **settings: Any) -> HFTrainerBackend:
    torch.manual_seed(0)
    made = HFTrainerBackend(OmegaConf.merge(OmegaConf.structured(HFConfig()), settings),
                            model_dir)
    made.keep_gradients = True  # the tests compare the last step's gradients
    return made


def test_a_group_s_prompt_is_computed_once(tiny_model_dir: str) -> None:
    batch = grouped_batch(tiny_model_dir)
    [micro] = micro_batches(batch.items, 64, 0, share_prefix=True)
    split = micro.prefix
    assert split is not None
    assert split.tokens.shape[0] == 6  # one prefix row per group
    for i, item in enumerate(batch.items):  # the split rebuilds every item
        n = int(split.lengths[i])
        rebuilt = (split.tokens[split.rows[i], :n].tolist()
                   + split.suffix[i, : int(split.suffix_mask[i].sum())].tolist())
        assert rebuilt == item.trajectory.tokens
        assert len(item.trajectory.tokens) - n >= 1
    # items that share nothing with a peer gain nothing: the plain path stays
    alone = [TrainItem(prompt_completion(f"t{i}", [3 + i, 4, 5], [6, 7], 1.0), 1.0)
             for i in range(4)]
    assert micro_batches(alone, 64, 0, share_prefix=True)[0].prefix is None


@pytest.mark.parametrize("micro_batch_size", [64, 4])
def test_shared_prefix_trains_as_the_plain_pass(tiny_model_dir: str,
                                                micro_batch_size: int) -> None:
    """Log-probs, entropies, the step's metrics and its gradients equal the plain
    pass's, with groups whole in one micro-batch or split across several."""
    plain = backend(tiny_model_dir, shared_prefix=False, micro_batch_size=micro_batch_size)
    shared = backend(tiny_model_dir, micro_batch_size=micro_batch_size)
    batch = with_behaviour_logprobs(plain, grouped_batch(tiny_model_dir))
    for a, b in zip(plain.compute_logprobs(batch), shared.compute_logprobs(batch), strict=True):
        assert a == pytest.approx(b, abs=1e-5)
    for _ in range(2):  # the second step is off-policy: ratios differ from 1
        want, got = plain.train_step(batch), shared.train_step(batch)
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
    assert shared.shared_prefix
    for (name, a), b in zip(plain.model.named_parameters(), shared.model.parameters(),
                            strict=True):  # the last step's gradients (before clipping)
        assert (a.grad - b.grad).abs().max() <= 1e-4 * a.grad.abs().max() + 1e-9, name


def test_shared_prefix_on_a_qwen2_model_with_a_kl_reference(tmp_path: Path) -> None:
    """Another architecture (tied embeddings), and the frozen KL reference shares its
    prefix too."""
    from astraflow.testing.models import make_chat_model

    model = make_chat_model(tmp_path / "qwen2", arch="qwen2")
    plain = backend(model, shared_prefix=False, kl_coef=0.1)
    shared = backend(model, kl_coef=0.1)
    batch = with_behaviour_logprobs(plain, grouped_batch(model, seed=1))
    plain.train_step(batch)
    shared.train_step(batch)
    want, got = plain.train_step(batch), shared.train_step(batch)
    assert got["kl"] == pytest.approx(want["kl"], rel=1e-4) and want["kl"] > 0
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-4, abs=1e-6)
    assert shared.shared_prefix


def test_a_model_whose_cached_pass_differs_trains_without_sharing(
        tiny_model_dir: str, caplog: pytest.LogCaptureFixture) -> None:
    """A model that ignores the position ids of the suffix pass would train on wrong
    log-probs: the first shared micro-batch is checked and sharing switched off."""

    class IgnoresPositions(HFTrainerBackend):
        def prefix_logits(self, model: Any, split: shared_prefix.SharedPrefix) -> Any:
            shifted = shared_prefix.SharedPrefix(**{**vars(split),
                                                    "lengths": split.lengths + 3})
            prefix, _ = super().prefix_logits(model, split)
            _, suffix = super().prefix_logits(model, shifted)
            return prefix, suffix

    torch.manual_seed(0)
    broken = IgnoresPositions(OmegaConf.structured(HFConfig()), tiny_model_dir)
    plain = backend(tiny_model_dir, shared_prefix=False)
    batch = with_behaviour_logprobs(plain, grouped_batch(tiny_model_dir))
    with caplog.at_level(logging.WARNING):
        got = broken.train_step(batch)
    assert not broken.shared_prefix
    assert "trainer.shared_prefix" in caplog.text
    assert got["loss"] == pytest.approx(plain.train_step(batch)["loss"], rel=1e-4)


def test_lora_adapters_share_the_prefix_too(tiny_model_dir: str) -> None:
    pytest.importorskip("peft")
    settings = {"lora": {"rank": 8}, "lr": 1e-3}
    plain = backend(tiny_model_dir, shared_prefix=False, **settings)
    shared = backend(tiny_model_dir, **settings)
    batch = with_behaviour_logprobs(plain, grouped_batch(tiny_model_dir, seed=2))
    for _ in range(2):
        want, got = plain.train_step(batch), shared.train_step(batch)
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-4, abs=1e-6)
    assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4)
    assert shared.shared_prefix


def test_a_token_budget_cuts_the_batch_and_trains_as_one_micro_batch(
        tiny_model_dir: str) -> None:
    """``micro_batch_tokens``: micro-batches by padded tokens, groups kept whole, and the
    same step as over the batch at once (the loss is normalised by the batch's tokens)."""
    whole = backend(tiny_model_dir)
    budget = 4 * max(len(i.trajectory.tokens) for i in grouped_batch(tiny_model_dir).items)
    packed = backend(tiny_model_dir, micro_batch_tokens=budget)
    batch = with_behaviour_logprobs(whole, grouped_batch(tiny_model_dir))
    micros = packed._micro_batches(batch.items)
    assert len(micros) > 1 and len(whole._micro_batches(batch.items)) == 1
    for micro in micros:
        assert micro.tokens.numel() <= budget
    for _ in range(2):
        want, got = whole.train_step(batch), packed.train_step(batch)
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
    for (name, a), b in zip(whole.model.named_parameters(), packed.model.parameters(),
                            strict=True):
        assert (a.grad - b.grad).abs().max() <= 1e-4 * a.grad.abs().max() + 1e-9, name


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("sharing", [True, False])
def test_logits_only_where_trained_train_as_all_of_them(tmp_path: Path, arch: str,
                                                       sharing: bool) -> None:
    """A step computes the output layer only at the columns the loss reads (prompts are
    not trained): the same metrics and gradients as over every column, and the logits
    it computes are those columns'."""
    from astraflow.testing.models import make_chat_model

    model = make_chat_model(tmp_path / arch, arch=arch)
    everywhere = backend(model, shared_prefix=sharing)
    everywhere.keeps_columns = False
    kept = backend(model, shared_prefix=sharing)
    widths: list[int] = []
    logits = kept.logits

    def counted(model: Any, tokens: torch.Tensor, columns: Any = None) -> torch.Tensor:
        out = logits(model, tokens, columns)
        widths.append(out.shape[1] - tokens.shape[1])
        return out

    kept.logits = counted  # type: ignore[method-assign]
    batch = with_behaviour_logprobs(everywhere, grouped_batch(model, seed=3))
    for _ in range(2):
        want, got = everywhere.train_step(batch), kept.train_step(batch)
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
    assert kept.shared_prefix == sharing
    if not sharing:  # prompts of several tokens: fewer columns than tokens
        assert widths and all(w < 0 for w in widths)
    for (name, a), b in zip(everywhere.model.named_parameters(), kept.model.parameters(),
                            strict=True):
        assert (a.grad - b.grad).abs().max() <= 1e-4 * a.grad.abs().max() + 1e-9, name


def test_a_prefix_pass_computes_the_columns_a_loss_reads() -> None:
    """Of a shared prompt only its last column (predicting the first completion token)
    is needed, unless tokens inside the prefix are trained."""
    split = shared_prefix.layout([[1, 2, 3, 4, 9], [1, 2, 3, 4, 8, 7], [5, 6, 7, 9]],
                                 ["a", "a", "b"], 6, 0)
    assert split is not None and split.tokens.shape[1] == 4
    prompt_only = torch.tensor([[0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 1, 1], [0, 0, 0, 1, 0, 0]])
    assert shared_prefix.prefix_columns(split, prompt_only).tolist() == [2, 3]
    inside = prompt_only.clone()
    inside[0, 2] = 1  # token 2 of the first item is trained: column 1 predicts it
    assert shared_prefix.prefix_columns(split, inside).tolist() == [1, 2, 3]
