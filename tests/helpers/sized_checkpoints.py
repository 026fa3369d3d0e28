"""Checkpoints of a real model's size that are only their safetensors header: what the
memory estimate reads (astraflow.launch.memory), none of the weights."""

from __future__ import annotations

import json
import math
import shutil
import struct
from pathlib import Path

#: Qwen2.5-1.5B's published shape
QWEN_1_5B = {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
             "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936}


def header_only_checkpoint(out: Path, shape: dict[str, int] = QWEN_1_5B,
                           tokenizer_from: str | None = None) -> Path:
    """A Qwen2 checkpoint of ``shape`` whose ``model.safetensors`` declares every tensor's
    full bf16 shape and offsets and is cut (sparse) at the size its header claims: 1.54B
    parameters and 3.1 GB for the default shape, none of it written. ``tokenizer_from``:
    a model directory whose tokenizer and config keys (end-of-sequence, padding) it
    takes, so a run's pre-flight renders prompts with it."""
    out.mkdir(parents=True)
    hidden, inter = shape["hidden_size"], shape["intermediate_size"]
    kv = shape["num_key_value_heads"] * hidden // shape["num_attention_heads"]
    shapes: dict[str, list[int]] = {"model.embed_tokens.weight": [shape["vocab_size"], hidden],
                                    "model.norm.weight": [hidden]}
    for i in range(shape["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {p + "self_attn.q_proj.weight": [hidden, hidden],
                   p + "self_attn.q_proj.bias": [hidden],
                   p + "self_attn.k_proj.weight": [kv, hidden], p + "self_attn.k_proj.bias": [kv],
                   p + "self_attn.v_proj.weight": [kv, hidden], p + "self_attn.v_proj.bias": [kv],
                   p + "self_attn.o_proj.weight": [hidden, hidden],
                   p + "mlp.gate_proj.weight": [inter, hidden],
                   p + "mlp.up_proj.weight": [inter, hidden],
                   p + "mlp.down_proj.weight": [hidden, inter],
                   p + "input_layernorm.weight": [hidden],
                   p + "post_attention_layernorm.weight": [hidden]}
    header, offset = {}, 0
    for name, dims in shapes.items():
        size = math.prod(dims) * 2
        header[name] = {"dtype": "BF16", "shape": dims, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    with (out / "model.safetensors").open("wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        fh.truncate(8 + len(raw) + offset)
    config: dict = {}
    if tokenizer_from is not None:
        for file in Path(tokenizer_from).iterdir():
            if file.name.startswith(("tokenizer", "special_tokens", "generation_config",
                                     "chat_template")):
                shutil.copy(file, out / file.name)
        config = json.loads((Path(tokenizer_from) / "config.json").read_text())
    config |= {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], **shape,
               "max_position_embeddings": 32768, "tie_word_embeddings": True}
    (out / "config.json").write_text(json.dumps(config))
    return out
