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
from safetensors.torch import load_file, load_model, save_file, save_model
from transformers import AutoModelForCausalLM

from astraflow.rl.policy_gradient import PolicyGradientBackend, dtype_of
from astraflow.text import copy_tokenizer_files

_MODEL_FILE = "model.safetensors"
_OPTIMIZER_FILE = "optimizer.safetensors"
_STATE_FILE = "trainer_state.json"
_FORMAT = 1


def _load_model(path: str, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype,
                                                local_files_only=True).to(device)


def resolve_device(name: str) -> torch.device:
    """``auto``: the first CUDA device when there is one, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"device={name!r}: use auto, cpu, cuda or cuda:N ({exc})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} but torch sees no CUDA device here")
    return device


class HFTrainerBackend(PolicyGradientBackend):
    """PPO-clip / GRPO or M2PO over a ``transformers`` causal LM, on CPU or one device."""

    def __init__(self, config: Any, model_path: str) -> None:
        super().__init__(config, model_path)
        self.dtype = dtype_of(config.dtype, "dtype")
        self.export_dtype = dtype_of(config.export_dtype, "export_dtype")
        if config.num_threads > 0:
            torch.set_num_threads(config.num_threads)
        self.device = resolve_device(config.device)
        self.model = _load_model(model_path, self.dtype, self.device).train()
        self.reference = None
        if config.kl_coef:
            self.reference = _load_model(model_path, self.dtype,
                                         self.device).eval().requires_grad_(False)
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
        out, seen = {}, set()
        for name, tensor in self.model.state_dict().items():
            # tied weights (e.g. embeddings shared with the output layer) are published
            # once, under the first name, as the checkpoint itself stores them
            if tensor.data_ptr() in seen:
                continue
            seen.add(tensor.data_ptr())
            out[name] = tensor.detach().to(device="cpu", dtype=self.export_dtype, copy=True)
        return out

    # -- persistence ---------------------------------------------------------------

    def save_checkpoint(self, path: str) -> None:
        """Model and AdamW moments as safetensors; step and hyperparameters as JSON.

        ``trainer_state.json`` is written last, so its presence marks a whole checkpoint.
        """
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        save_model(self.model, str(out / _MODEL_FILE))  # stores tied weights once
        names = {id(p): name for name, p in self.model.named_parameters()}
        moments = {}
        for param, state in self.optimizer.state.items():
            for key, value in state.items():
                moments[f"{names[id(param)]}::{key}"] = value.detach().cpu().contiguous()
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
        load_model(self.model, str(src / _MODEL_FILE), strict=True, device=str(self.device))
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
        """The model in its training dtype, plus the tokenizer files it was loaded with."""
        self.model.save_pretrained(path)
        copy_tokenizer_files(self.model_path, path)
