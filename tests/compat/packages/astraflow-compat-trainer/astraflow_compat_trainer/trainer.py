"""``trainer=compat_trainer``: the model, its optimiser and checkpoints; the step is
AstraFlow's :class:`PolicyGradientBackend`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from astraflow.rl.policy_gradient import PolicyGradientBackend
from astraflow.types import Batch


class CompatTrainer(PolicyGradientBackend):
    def __init__(self, config: Any, model_path: str) -> None:
        super().__init__(config, model_path)
        self.device = torch.device("cpu")
        self.model = self._load().train()
        if config.kl_coef:
            self.reference = self._load().eval().requires_grad_(False)
        self.pad_token_id = self.model.config.pad_token_id or 0
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=config.lr, betas=(config.beta1, config.beta2),
            eps=config.adam_eps, weight_decay=config.weight_decay)

    def _load(self) -> Any:
        return AutoModelForCausalLM.from_pretrained(self.model_path, dtype=self.dtype,
                                                    local_files_only=True)

    def logits(self, model: Any, tokens: torch.Tensor) -> torch.Tensor:
        return model(input_ids=tokens, use_cache=False).logits.float()

    def train_step(self, batch: Batch) -> dict[str, float]:
        metrics = super().train_step(batch)
        with torch.no_grad():
            squares = sum(float(p.float().square().sum()) for p in self.model.parameters())
        metrics["weight_norm"] = squares ** 0.5
        return metrics

    def export_weights(self) -> dict[str, Any]:
        return {name: tensor.detach().to(self.export_dtype, copy=True)
                for name, tensor in self.model.state_dict().items()}

    def save_checkpoint(self, path: str) -> None:
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.model.state_dict().items()},
                  str(out / "model.safetensors"))
        torch.save(self.optimizer.state_dict(), out / "optimizer.pt")
        (out / "state.json").write_text(json.dumps({"step": self.step}))

    def load_checkpoint(self, path: str) -> None:
        src = Path(path)
        self.model.load_state_dict(load_file(str(src / "model.safetensors")))
        self.optimizer.load_state_dict(torch.load(src / "optimizer.pt", weights_only=True))
        self.step = json.loads((src / "state.json").read_text())["step"]

    def save_pretrained(self, path: str) -> None:
        self.model.save_pretrained(path)
        for src in Path(self.model_path).iterdir():  # the tokenizer, chat template, ...
            if src.is_file() and not (Path(path) / src.name).exists() \
                    and src.suffix not in (".safetensors", ".bin"):
                shutil.copy(src, path)
