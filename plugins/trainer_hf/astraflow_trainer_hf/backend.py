"""``trainer=hf``: one policy's Hugging Face causal LM and its AdamW optimiser.

The step (micro-batching, losses, accumulation, metrics) is
:class:`astraflow.rl.policy_gradient.PolicyGradientBackend`, shared with every trainer
backend; this module owns the model, the optimiser and checkpoints.

Checkpoints hold tensors in safetensors and everything else in JSON: nothing is
pickled, so a checkpoint can be loaded from an untrusted directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from astraflow.rl.policy_gradient import PolicyGradientBackend, dtype_of

_MODEL_FILE = "model.safetensors"
_OPTIMIZER_FILE = "optimizer.safetensors"
_STATE_FILE = "trainer_state.json"
_FORMAT = 1


def _load_model(path: str, dtype: torch.dtype) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)


class HFTrainerBackend(PolicyGradientBackend):
    """PPO-clip / GRPO or M2PO over a ``transformers`` causal LM, on CPU or one device."""

    def __init__(self, config: Any, model_path: str) -> None:
        super().__init__(config, model_path)
        self.dtype = dtype_of(config.dtype, "dtype")
        self.export_dtype = dtype_of(config.export_dtype, "export_dtype")
        if config.num_threads > 0:
            torch.set_num_threads(config.num_threads)
        self.model = _load_model(model_path, self.dtype).train()
        self.reference = None
        if config.kl_coef:
            self.reference = _load_model(model_path, self.dtype).eval().requires_grad_(False)
        pad = self.model.config.pad_token_id
        self.pad_token_id: int = 0 if pad is None else int(pad)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=config.lr,
            betas=(config.beta1, config.beta2),
            eps=config.adam_eps,
            weight_decay=config.weight_decay,
        )
        self.step = 0

    def logits(self, model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        return model(input_ids=tokens, use_cache=False).logits

    # -- the rest of the contract -----------------------------------------------------

    def export_weights(self) -> dict[str, torch.Tensor]:
        """A snapshot (copies) in ``export_dtype``: later steps never change it."""
        return {
            name: tensor.detach().to(self.export_dtype, copy=True)
            for name, tensor in self.model.state_dict().items()
        }

    # -- persistence ---------------------------------------------------------------

    def save_checkpoint(self, path: str) -> None:
        """Model and AdamW moments as safetensors; step and hyperparameters as JSON.

        ``trainer_state.json`` is written last, so its presence marks a whole checkpoint.
        """
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        save_file(
            {k: v.detach().contiguous() for k, v in self.model.state_dict().items()},
            str(out / _MODEL_FILE),
        )
        names = {id(p): name for name, p in self.model.named_parameters()}
        moments = {}
        for param, state in self.optimizer.state.items():
            for key, value in state.items():
                moments[f"{names[id(param)]}::{key}"] = value.detach().contiguous()
        save_file(moments, str(out / _OPTIMIZER_FILE))
        groups = [
            {k: v for k, v in group.items() if k != "params"}
            for group in self.optimizer.state_dict()["param_groups"]
        ]
        state = {
            "format": _FORMAT,
            "step": self.step,
            "dtype": self.config.dtype,
            "param_groups": groups,
        }
        (out / _STATE_FILE).write_text(json.dumps(state, indent=2))

    def load_checkpoint(self, path: str) -> None:
        src = Path(path)
        state_path = src / _STATE_FILE
        if not state_path.exists():
            raise FileNotFoundError(f"{src} holds no complete checkpoint ({_STATE_FILE} missing)")
        state = json.loads(state_path.read_text())
        if state.get("format") != _FORMAT:
            raise ValueError(f"{src}: checkpoint format {state.get('format')}, expected {_FORMAT}")
        if state["dtype"] != self.config.dtype:
            raise ValueError(
                f"{src} was trained in {state['dtype']}, this trainer uses {self.config.dtype}"
            )
        self.model.load_state_dict(load_file(str(src / _MODEL_FILE)), strict=True)
        moments = load_file(str(src / _OPTIMIZER_FILE))
        index = {name: i for i, (name, _) in enumerate(self.model.named_parameters())}
        per_param: dict[int, dict[str, torch.Tensor]] = {}
        for key, value in moments.items():
            name, _, slot = key.rpartition("::")
            per_param.setdefault(index[name], {})[slot] = value
        current = self.optimizer.state_dict()["param_groups"]
        groups = [
            {**saved, "params": group["params"]}
            for saved, group in zip(state["param_groups"], current, strict=True)
        ]
        self.optimizer.load_state_dict({"state": per_param, "param_groups": groups})
        self.step = int(state["step"])

    def save_pretrained(self, path: str) -> None:
        """The model in its training dtype, plus the tokenizer it was loaded with."""
        self.model.save_pretrained(path)
        if (Path(self.model_path) / "tokenizer_config.json").exists():
            AutoTokenizer.from_pretrained(self.model_path, local_files_only=True).save_pretrained(
                path
            )
