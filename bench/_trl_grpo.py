"""TRL's GRPOTrainer on an AstraFlow run config (run by bench/peers.py in the TRL venv).

Everything comes from the resolved AstraFlow config ``peers.py`` composed (the same
one, overrides included, that the AstraFlow side runs): the model directory, the
task's train split in AstraFlow's order, the prompts as AstraFlow's tokenizer encodes
them, the workflow's reward (its ``completion_text`` and ``score``), the batch shape and
its micro-batches, the optimiser, the learning-rate schedule and the held-out evaluation.

A synchronous trainer waits for the slowest sample of its batch: with
``workflow.latency`` set, the reward function (called once per generation batch)
sleeps the largest of one latency draw per completion.

Usage: python _trl_grpo.py CONFIG_YAML OUT_JSON [--threads 2]
Writes OUT_JSON: every step's end time and the held-out accuracy every
``eval_every`` steps, with the evaluation time kept out of the training clock.
"""

from __future__ import annotations

import time

STARTED = time.time()  # the command's start, before the heavy imports

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402


def grpo_settings(cfg: Any) -> dict[str, Any]:
    """GRPOConfig arguments equal to AstraFlow's run ``cfg``; refuses what TRL lacks."""
    trainer = cfg.trainer
    if trainer.loss != "ppo":
        raise SystemExit(f"trainer.loss={trainer.loss}: only ppo (PPO-clip) has a TRL twin")
    if trainer.lr_schedule == "cosine":
        schedule = {"lr_scheduler_type": "cosine_with_min_lr",
                    "lr_scheduler_kwargs": {"min_lr_rate": float(trainer.min_lr_ratio)}}
    elif trainer.lr_schedule == "constant":
        schedule = {"lr_scheduler_type": "constant_with_warmup"}
    else:
        raise SystemExit(f"trainer.lr_schedule={trainer.lr_schedule}: no TRL twin here")
    if trainer.total_steps not in (0, cfg.steps):
        raise SystemExit(f"trainer.total_steps={trainer.total_steps}: the TRL schedule spans "
                         "the run's steps")
    if cfg.batch_size % cfg.group_size:
        raise SystemExit(f"batch_size={cfg.batch_size} is not a multiple of group_size")
    micro = min(int(trainer.micro_batch_size), int(cfg.batch_size))
    if cfg.batch_size % micro:
        raise SystemExit(f"trainer.micro_batch_size={micro} does not divide batch_size="
                         f"{cfg.batch_size}: TRL accumulates whole micro-batches")
    if int(trainer.get("micro_batch_tokens", 0)):
        raise SystemExit("trainer.micro_batch_tokens: TRL has no micro-batches bounded by "
                         "tokens")
    return {
        "seed": int(cfg.seed),
        "max_steps": int(cfg.steps),
        # one optimizer step = one generation batch = batch_size completions, trained in
        # AstraFlow's micro-batches (the same memory bound): micro_batch_size sequences a
        # forward and backward, accumulated; the "dapo" loss divides each by the whole
        # generation batch's tokens, so the step's gradient is the batch's token mean
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": int(cfg.batch_size) // micro,
        "steps_per_generation": int(cfg.batch_size) // micro,
        "num_iterations": 1,
        "num_generations": int(cfg.group_size),
        "max_completion_length": int(cfg.workflow.max_new_tokens),
        "temperature": float(cfg.workflow.temperature),
        "top_p": 1.0,
        # AstraFlow's HF engine leaves top_k unset: transformers' default, 50
        "top_k": 50,
        "learning_rate": float(trainer.lr),
        **schedule,
        "warmup_steps": int(trainer.warmup_steps),
        "optim": "adamw_torch",
        "adam_beta1": float(trainer.beta1),
        "adam_beta2": float(trainer.beta2),
        "adam_epsilon": float(trainer.adam_eps),
        "weight_decay": float(trainer.weight_decay),
        "max_grad_norm": float(trainer.max_grad_norm),
        "beta": float(trainer.kl_coef),
        "epsilon": float(trainer.eps_low),
        "epsilon_high": float(trainer.eps_high),
        # the token mean over the whole batch, as AstraFlow's loss
        "loss_type": "dapo",
        "scale_rewards": "group",
        "mask_truncated_completions": False,
        # AstraFlow's order: the train split as the task source yields it, cycled
        "shuffle_dataset": False,
        "bf16": False,
        "fp16": False,
        "activation_checkpointing": False,  # TRL's default is on; AstraFlow's off
        "use_cpu": True,
        "save_strategy": "no",
        "eval_strategy": "no",
        "report_to": "none",
        "logging_steps": 10,
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="the resolved AstraFlow run config (config.yaml)")
    parser.add_argument("out", help="where to write the timings and evaluations (JSON)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    args = parser.parse_args()

    import torch
    from datasets import Dataset
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from astraflow.components import build_workflow
    from astraflow.plugins import get_registry
    from astraflow.text import load_tokenizer
    from astraflow.types import Task
    from astraflow.workflows.latency import Latency, LatencyConfig

    torch.set_num_threads(args.threads)
    cfg = OmegaConf.load(args.config)
    out_path = Path(args.out)
    settings = grpo_settings(cfg)
    model_path = str(cfg.model.path)

    # AstraFlow's text layer, task source and workflow (its reward and completion text)
    tokenizer = load_tokenizer(model_path).configure(cfg.task)
    workflow = build_workflow(cfg, tokenizer)
    source = get_registry().get("task", cfg.task.name).create(cfg.task)
    train, held_out = list(source.train_tasks()), source.eval_tasks()
    if not train:
        raise SystemExit(f"task={cfg.task.name} has no training tasks")
    prompt_ids = {t.prompt: tokenizer.encode_prompt(t.prompt) for t in train + held_out}
    # TRL takes text: the ids AstraFlow feeds, as text (special tokens kept); checked
    # below against TRL's own tokenization of it
    prompt_text = {p: tokenizer.decode(ids, skip_special_tokens=False)
                   for p, ids in prompt_ids.items()}
    per_step = cfg.batch_size // cfg.group_size
    stream = [train[i % len(train)] for i in range(cfg.steps * per_step)]
    dataset = Dataset.from_list([{"prompt": prompt_text[t.prompt], "task": i % len(train)}
                                 for i, t in enumerate(stream)])

    latency_cfg = cfg.workflow.get("latency")
    latency = None
    if latency_cfg is not None and latency_cfg.kind != "none":
        latency = Latency(LatencyConfig(**OmegaConf.to_container(latency_cfg)), seed=cfg.seed)
    loop = asyncio.new_event_loop()
    counters = {"latency_seconds": 0.0, "reward_failed": 0}

    async def score_all(tasks: list[Task], ids: list[list[int]]) -> list[float]:
        scores = await asyncio.gather(*(workflow.score(task, workflow.completion_text(c))
                                        for task, c in zip(tasks, ids, strict=True)))
        counters["reward_failed"] += sum(s.failed for s in scores)
        return [s.value for s in scores]

    def reward(prompts: list[str], completions: list[str], completion_ids: list[list[int]],
               task: list[int], **_: Any) -> list[float]:
        if latency is not None:  # every sample's environment call; the batch waits for all
            delay = max(latency.sample() for _ in completion_ids)
            counters["latency_seconds"] += delay
            time.sleep(delay)
        return loop.run_until_complete(score_all([train[i] for i in task], completion_ids))

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32,
                                                 local_files_only=True)
    hf_tokenizer = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    grpo_args = GRPOConfig(output_dir=str(out_path.parent / "trl-output"), **settings)

    class Clock(TrainerCallback):
        """Step end times and held-out accuracy; evaluation time kept out of the clock."""

        def __init__(self) -> None:
            self.steps: list[dict[str, float]] = []
            self.evals: list[dict[str, float]] = []
            self.eval_seconds = 0.0
            self.train_begin = 0.0
            self.logs: list[dict[str, Any]] = []

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            self.train_begin = time.time()
            self.evaluate(model, 0)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            step = state.global_step
            self.steps.append({"step": step, "time": time.time(),
                               "eval_seconds": self.eval_seconds})
            if step % cfg.eval_every == 0 or step == state.max_steps:
                self.evaluate(model, step)

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.logs.append({"step": state.global_step, **(logs or {})})

        def evaluate(self, model: Any, step: int) -> None:
            started = time.time()
            accuracy = held_out_accuracy(model, step)
            self.evals.append({"step": step, "eval_accuracy": accuracy, "time": started,
                               "eval_seconds": self.eval_seconds})
            self.eval_seconds += time.time() - started
            train_seconds = started - self.train_begin - self.evals[-1]["eval_seconds"]
            print(f"trl: step {step:4d}  eval_accuracy {accuracy:.3f}  "
                  f"(training {train_seconds:7.1f} s, evaluating {time.time() - started:.1f} s)",
                  flush=True)

    def held_out_accuracy(model: Any, step: int) -> float:
        """AstraFlow's ``eval_accuracy``: the mean reward of ``eval_samples`` samples per
        held-out task at the workflow's temperature, generated as its HF engine does."""
        samples = int(cfg.eval_samples)
        rows = [(task, prompt_ids[task.prompt]) for task in held_out for _ in range(samples)]
        stop = list(tokenizer.stop_token_ids)
        pad = tokenizer.pad_token_id
        was_training = model.training
        model.eval()
        completions: list[list[int]] = []
        # the evaluation's sampling leaves the training's random stream as it was
        with torch.random.fork_rng(devices=[]), torch.inference_mode():
            torch.manual_seed(int(cfg.seed) * 100003 + step)
            for start in range(0, len(rows), 256):
                chunk = [ids for _, ids in rows[start : start + 256]]
                width = max(len(ids) for ids in chunk)
                input_ids = torch.full((len(chunk), width), pad, dtype=torch.long)
                attention = torch.zeros((len(chunk), width), dtype=torch.long)
                for r, ids in enumerate(chunk):  # left padding, as the engine pads
                    input_ids[r, width - len(ids):] = torch.tensor(ids)
                    attention[r, width - len(ids):] = 1
                out = model.generate(input_ids=input_ids, attention_mask=attention,
                                     do_sample=True, temperature=float(cfg.workflow.temperature),
                                     top_p=1.0, top_k=None,
                                     max_new_tokens=int(cfg.workflow.max_new_tokens),
                                     eos_token_id=stop, pad_token_id=pad)
                for new in out[:, width:].tolist():
                    cut = next((i + 1 for i, t in enumerate(new) if t in stop), len(new))
                    completions.append(new[:cut])
        if was_training:
            model.train()
        scores = loop.run_until_complete(score_all([t for t, _ in rows], completions))
        return sum(scores) / max(len(scores), 1)

    clock = Clock()
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=grpo_args,
                          train_dataset=dataset, processing_class=hf_tokenizer,
                          callbacks=[clock])
    trainer.remove_callback(PrinterCallback)
    # the ids TRL will feed must be AstraFlow's, prompt for prompt
    texts = list(prompt_text.values())
    trl_ids, _, _ = trainer._tokenize_prompts(texts)
    for text, ids, expected in zip(texts, trl_ids, prompt_ids.values(), strict=True):
        if list(ids) != list(expected):
            raise SystemExit(f"TRL tokenizes the prompt {text!r} as {list(ids)}, AstraFlow as "
                             f"{expected}: the two sides would not train on the same tokens")
    if trainer.model.is_activation_checkpointing:
        raise SystemExit("TRL's model recomputes activations; AstraFlow's trainer does not")
    eos = set(trainer.eos_token_ids)
    if eos != set(tokenizer.stop_token_ids):
        raise SystemExit(f"TRL stops generating at {sorted(eos)}, AstraFlow at "
                         f"{sorted(tokenizer.stop_token_ids)}")
    print(f"trl: {cfg.steps} steps of {per_step} prompts x {cfg.group_size}, prompts checked "
          f"({len(texts)} encode as AstraFlow encodes them), latency "
          f"{'none' if latency is None else OmegaConf.to_container(latency_cfg)}", flush=True)
    trainer.train()
    loop.close()
    out_path.write_text(json.dumps({
        "started": STARTED,
        "train_begin": clock.train_begin,
        "steps": clock.steps,
        "evals": clock.evals,
        "eval_seconds": clock.eval_seconds,
        "latency_seconds": counters["latency_seconds"],
        "reward_failed": counters["reward_failed"],
        "grpo_config": settings,
        "threads": args.threads,
        "versions": {"torch": torch.__version__, "trl": __import__("trl").__version__,
                     "transformers": __import__("transformers").__version__},
        "logs": clock.logs,
    }, indent=1) + "\n")


if __name__ == "__main__":
    main()
