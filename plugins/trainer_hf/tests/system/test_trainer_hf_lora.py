"""``trainer=hf`` with ``trainer.lora.rank``: peft adapters pass the trainer contract, and
only they train, take optimiser state, fill checkpoints and get published."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from astraflow_trainer_hf import HFConfig
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM

from astraflow.testing.trainer import (
    TrainerBackendContract,
    _direct_logprobs,
    arithmetic_batch,
    with_behaviour_logprobs,
)
from astraflow.weights.base import write_peft_dir
from astraflow.weights.safetensors_io import from_torch, save

pytest.importorskip("peft")


def lora_config(**kw: Any) -> Any:
    config = OmegaConf.structured(HFConfig(**kw))
    config.lora.rank = 16
    return config


def served_logprobs(backend: Any, model_dir: str, batch: Any, tmp_path: Any) -> list:
    """What ``peft`` samples with the trainer's published adapter over the base model,
    as ``raas=hf`` serves it."""
    from peft import PeftModel

    export_dir = tmp_path / "exported"
    save(export_dir / "model.safetensors",
         {k: from_torch(v) for k, v in backend.export_weights().items()})
    write_peft_dir(export_dir, {"config": backend.adapter_config()})
    base = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    return _direct_logprobs(PeftModel.from_pretrained(base, export_dir).eval(), batch)


class TestHFTrainerLora(TrainerBackendContract):
    """The shared contract, adapters instead of whole weights (with a KL reference: the
    same model with its adapters switched off)."""

    backend_name = "hf"
    sign_lr = 1e-3

    @pytest.fixture
    def backend_config(self) -> Any:
        return lora_config(kl_coef=0.05, lr=3e-3)  # adapters start at zero: a LoRA rate

    def test_exported_weights_load_into_transformers(self, make_backend, batch,
                                                     tiny_model_dir, tmp_path) -> None:
        """The export is a peft adapter of the base: peft loads it and samples what the
        trainer trained; the final output is a peft adapter directory plus, with
        merge_final, the merged model."""
        from peft import PeftModel

        backend = make_backend()
        for _ in range(3):
            backend.train_step(with_behaviour_logprobs(backend, batch))
        exported = backend.export_weights()
        assert exported and all(".lora_A." in k or ".lora_B." in k for k in exported)
        for got, trained in zip(served_logprobs(backend, tiny_model_dir, batch, tmp_path),
                                backend.compute_logprobs(batch), strict=True):
            assert torch.allclose(torch.tensor(got), torch.tensor(trained),
                                  atol=self.export_logprob_atol)

        backend.config.lora.merge_final = True
        backend.save_pretrained(str(tmp_path / "final"))
        final = tmp_path / "final"
        assert (final / "adapter_config.json").is_file()
        assert (final / "adapter_model.safetensors").is_file()
        adapter = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True),
            final).eval()
        merged = AutoModelForCausalLM.from_pretrained(final / "merged", local_files_only=True)
        trained = backend.compute_logprobs(batch)
        for model in (adapter, merged):
            for got, want in zip(_direct_logprobs(model, batch), trained, strict=True):
                assert torch.allclose(torch.tensor(got), torch.tensor(want), atol=1e-4)
        assert (final / "merged" / "tokenizer.json").is_file()


def test_only_the_adapters_train_and_fill_optimiser_and_checkpoints(tiny_model_dir, tmp_path):
    from astraflow_trainer_hf.backend import HFTrainerBackend

    backend = HFTrainerBackend(lora_config(), tiny_model_dir)
    full = HFTrainerBackend(OmegaConf.structured(HFConfig()), tiny_model_dir)
    trainable = [n for n, p in backend.model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n for n in trainable)
    moments = sum(p.numel() for g in backend.optimizer.param_groups for p in g["params"])
    adapter = sum(t.numel() for t in backend.export_weights().values())
    assert moments == adapter
    whole = sum(t.numel() for t in full.export_weights().values())
    assert adapter < whole / 4  # rank 16 of a 128-wide model (of a 7B one: 1/190)
    before = {n: p.detach().clone() for n, p in backend.model.named_parameters()}
    batch = arithmetic_batch(tiny_model_dir, [1.0, -1.0, 0.5, -0.5])
    backend.train_step(with_behaviour_logprobs(backend, batch))
    for name, param in backend.model.named_parameters():
        if not param.requires_grad:
            assert torch.equal(param, before[name]), f"frozen {name} changed"
    backend.save_checkpoint(str(tmp_path / "lora"))
    full.save_checkpoint(str(tmp_path / "full"))
    size = sum(f.stat().st_size for f in (tmp_path / "lora").iterdir())
    assert size < sum(f.stat().st_size for f in (tmp_path / "full").iterdir()) / 4
    with pytest.raises(ValueError, match=r"trainer.lora.rank=16, this one has 0"):
        full.load_checkpoint(str(tmp_path / "lora"))


def test_a_target_module_that_matches_nothing_names_the_layers_there_are(tiny_model_dir):
    from astraflow_trainer_hf.backend import HFTrainerBackend

    config = lora_config()
    config.lora.target_modules = ["q_proj", "qkv"]
    with pytest.raises(ValueError, match=r"\['qkv'\] match no module of .*its linear layers "
                                         r"are \[.*'q_proj'.*\]"):
        HFTrainerBackend(config, tiny_model_dir)


@pytest.mark.parametrize(("setting", "value", "said"), [
    ("rank", -1, "trainer.lora.rank=-1: must be >= 0 (0: no adapters)"),
    ("dropout", 1.0, "trainer.lora.dropout=1.0: must be < 1"),
    ("lr_ratio", 0.0, "trainer.lora.lr_ratio=0.0: must be > 0 (1: plain LoRA)"),
])
def test_impossible_lora_settings_are_refused(setting, value, said):
    """Ranges declared with the settings, refused as the config is composed."""
    from astraflow.config import compose_config
    from astraflow.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        compose_config(["trainer.lora.rank=16", f"trainer.lora.{setting}={value}"])
    assert str(info.value) == said


def test_an_empty_list_of_target_modules_is_refused():
    from astraflow_trainer_hf.backend import HFTrainerBackend

    config = lora_config()
    config.lora.target_modules = []
    with pytest.raises(ValueError) as info:
        HFTrainerBackend.check_config(config)
    assert "trainer.lora.target_modules=[]: give module names" in str(info.value)


def test_named_targets_adapt_only_those_layers(tiny_model_dir):
    from astraflow_trainer_hf.backend import HFTrainerBackend

    config = lora_config()
    config.lora.target_modules = ["q_proj", "v_proj"]
    backend = HFTrainerBackend(config, tiny_model_dir)
    kinds = {name.split(".lora_")[0].rsplit(".", 1)[-1] for name in backend.export_weights()}
    assert kinds == {"q_proj", "v_proj"}


def test_lora_plus_steps_the_b_matrices_at_a_multiple_of_the_rate(tiny_model_dir, tmp_path):
    """trainer.lora.lr_ratio=4 (LoRA+): the B matrices step at 4x trainer.lr, the A
    matrices at 1x, the schedule applied to both; a checkpoint resumes the same next
    step; resuming it as plain LoRA is refused in one line."""
    from astraflow_trainer_hf.backend import HFTrainerBackend

    config = lora_config(lr=1e-3, lr_schedule="constant")
    config.lora.lr_ratio = 4.0
    backend = HFTrainerBackend(config, tiny_model_dir)
    batch = arithmetic_batch(tiny_model_dir, [1.0, -1.0, 0.5, -0.5])
    backend.train_step(with_behaviour_logprobs(backend, batch))
    names = {id(p): n for n, p in backend.model.named_parameters()}
    rates = {}
    for group in backend.optimizer.param_groups:
        for param in group["params"]:
            rates[names[id(param)]] = group["lr"]
    assert {rates[n] for n in rates if ".lora_A." in n} == {1e-3}
    assert {rates[n] for n in rates if ".lora_B." in n} == {4e-3}
    backend.save_checkpoint(str(tmp_path / "ckpt"))
    resumed = HFTrainerBackend(config, tiny_model_dir)
    resumed.load_checkpoint(str(tmp_path / "ckpt"))
    a, b = (m.train_step(with_behaviour_logprobs(m, batch)) for m in (backend, resumed))
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
    after = {n: p for n, p in resumed.model.named_parameters() if p.requires_grad}
    for name, param in backend.model.named_parameters():
        if param.requires_grad:
            torch.testing.assert_close(param, after[name], rtol=1e-6, atol=1e-7)
    plain = HFTrainerBackend(lora_config(lr=1e-3), tiny_model_dir)
    with pytest.raises(ValueError, match="lr_ratio"):
        plain.load_checkpoint(str(tmp_path / "ckpt"))


#: one expert's projections as each layout's checkpoint names them
EXPERT_PROJECTIONS = {"qwen3_moe": ["gate_proj", "up_proj", "down_proj"],
                      "mixtral": ["w1", "w3", "w2"]}


@pytest.mark.parametrize("arch", sorted(EXPERT_PROJECTIONS))
def test_lora_adapts_a_moe_models_experts_as_its_checkpoint_names_them(arch, tmp_path):
    """Naming one expert's projections adapts every expert of every MoE layer (held
    fused in memory, peft's ``target_parameters``): the published adapter is what peft
    loads over the base to sample what the trainer trained (as ``raas=hf`` does), and
    the merged final model, stored one matrix per expert, scores the same (to float32
    noise: peft applies the expert adapters in another order than the trainer)."""
    from astraflow_trainer_hf.backend import HFTrainerBackend

    from astraflow.testing.models import make_chat_model

    model_dir = make_chat_model(tmp_path / arch, arch=arch)
    config = lora_config(lr=3e-3)
    config.lora.target_modules = ["q_proj", "v_proj", *EXPERT_PROJECTIONS[arch]]
    backend = HFTrainerBackend(config, model_dir)
    trained = {n for n, p in backend.model.named_parameters() if p.requires_grad}
    assert any(".mlp.experts." in n for n in trained), trained
    batch = arithmetic_batch(model_dir, [1.0, -1.0, 0.5, -0.5])
    before = backend.compute_logprobs(batch)
    for _ in range(3):
        backend.train_step(with_behaviour_logprobs(backend, batch))
    after = backend.compute_logprobs(batch)
    assert max(abs(a - b) for x, y in zip(before, after, strict=True)
               for a, b in zip(x, y, strict=True)) > 1e-3  # the adapters moved it

    exported = backend.export_weights()
    experts = [k for k in exported if ".mlp.experts." in k]
    assert experts and all(".lora_A." in k or ".lora_B." in k for k in exported)
    for got, want in zip(served_logprobs(backend, model_dir, batch, tmp_path), after,
                         strict=True):
        assert torch.allclose(torch.tensor(got), torch.tensor(want), atol=1e-3)

    backend.config.lora.merge_final = True
    backend.save_pretrained(str(tmp_path / "final"))
    from safetensors.torch import load_file

    stored = load_file(f"{model_dir}/model.safetensors")
    merged_dir = tmp_path / "final" / "merged"
    assert load_file(str(merged_dir / "model.safetensors")).keys() == stored.keys()
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, local_files_only=True)
    for got, want in zip(_direct_logprobs(merged, batch), after, strict=True):
        assert torch.allclose(torch.tensor(got), torch.tensor(want), atol=1e-3)


def test_half_of_a_fused_expert_tensor_is_refused(tmp_path):
    """transformers holds gate and up projections as one tensor: adapting one alone
    cannot be done, and the error says which tensor and what to add."""
    from astraflow_trainer_hf.backend import HFTrainerBackend

    from astraflow.testing.models import make_chat_model

    model_dir = make_chat_model(tmp_path / "moe", arch="qwen3_moe")
    config = lora_config()
    config.lora.target_modules = ["q_proj", "gate_proj", "down_proj"]
    with pytest.raises(ValueError) as info:
        HFTrainerBackend(config, model_dir)
    assert str(info.value) == ("trainer.lora.target_modules: ['gate_proj'] without "
                               "['up_proj']: the model holds them as one tensor "
                               "(experts.gate_up_proj); adapt all or none")
