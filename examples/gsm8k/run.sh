#!/usr/bin/env bash
# GRPO on GSM8K with Qwen2.5-0.5B-Instruct: a vLLM rollout node and a transformers trainer
# sharing one GPU of 40 GB or more: the node's and the evaluator's vLLM engines take 30% of
# its memory each, the trainer (fp32 weights and AdamW state, ~8 GB) the rest.
# For a GPU machine; not run here.
#   MODEL: a local copy of the checkpoint (config.json, model.safetensors, tokenizer.json)
#   DATA:  the output folder of prepare_gsm8k.py
set -euo pipefail
MODEL=${MODEL:-$HOME/models/Qwen2.5-0.5B-Instruct}
DATA=${DATA:-data/gsm8k}

python -m astraflow \
  model.path="$MODEL" \
  task=jsonl task.train_files="[$DATA/train.jsonl]" task.eval_files="[$DATA/test.jsonl]" \
  task.max_prompt_tokens=512 \
  reward=math \
  raas=vllm raas.dtype=bfloat16 raas.kv_cache_gib=null raas.gpu_memory_utilization=0.3 \
  trainer=hf trainer.device=cuda trainer.lr=1e-6 trainer.micro_batch_size=8 trainer.lr_schedule=constant \
  workflow=single_turn workflow.max_new_tokens=768 workflow.temperature=1.0 \
  steps=200 batch_size=512 group_size=8 eval_every=20 eval_samples=1 \
  num_nodes=1 node_concurrency=128 \
  "$@"
