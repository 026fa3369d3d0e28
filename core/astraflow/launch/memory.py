"""How much memory a run needs at its peak, estimated before anything starts, and how
much this machine has.

The estimate is built from what the launcher will really start (one trainer per
policy, ``num_nodes`` rollout nodes or the Ray pools' nodes, one evaluator per policy,
the data layer, the launcher and its preloaded parent) and from the checkpoint's
safetensors *headers* -- parameter count, dtype and shapes, a few kilobytes read, no
torch. It is a budget, not a measurement: each term below is simple on purpose, so the
line that refuses a run can say what it counted.

Per trainer (one per policy, ``trainer_settings`` of that policy), on the CPU:

- master weights: parameters x ``dtype`` bytes (4 for float32, 2 for bfloat16);
- gradients and AdamW's two moments: trained parameters x 3 x ``dtype`` bytes (with
  ``lora.rank`` > 0 only the adapters are trained: rank x (in + out) per adapted
  linear layer), so float32 AdamW costs 4 + 4 + 8 = 16 bytes a parameter;
- a frozen reference copy (``kl_coef`` > 0, without LoRA): parameters x ``dtype`` bytes;
- the published copy: published parameters x ``export_dtype`` bytes;
- activations of one micro-batch per rank: its tokens (``micro_batch_tokens``, or
  ``min(micro_batch_size, batch / ranks)`` sequences of prompt + response tokens) x
  (vocab x 4 bytes x 3 for the float32 logits, their log-softmax and its gradient
  + layers x (10 x hidden + 4 x intermediate) values a decoder layer keeps for its
  backward pass, in the compute dtype; with ``activation_checkpointing`` a layer keeps
  its input alone, and one layer's full set is recomputed at a time);
- or, when larger, a checkpoint being written between steps (the activations are freed
  then): :data:`CHECKPOINT_COPIES` copies of the weights and AdamW moments (12 B a
  parameter in float32; 24 B with both copies, as measured for ``trainer=hf``);
- one Python process that imported torch (:data:`TORCH_PROCESS`) per rank.

States are sharded over ``world_size`` ranks on one machine, so their sum is counted
once; activations and processes once per rank. A trainer on a GPU keeps its states
there: on the host it costs its processes and the published copy (and the states
with ``cpu_offload``).

Per rollout node and per evaluator, one engine per policy (one for all with LoRA):

- ``raas=hf``: weights in ``raas.dtype`` (``auto``: the dtype the checkpoint's
  ``config.json`` declares, float32 when it declares none) + the keys and values of
  ``min(max_batch_size, node_concurrency x group_size)`` sequences (layers x 2 x
  key-value width x ``raas.dtype`` bytes a token) + the last position's logits twice
  (+ ``raas.prefix_cache_gib``, at most that cache again, when sequences reach
  ``raas.prefix_cache_min_tokens``);
- ``raas=vllm``: weights in ``raas.dtype`` + its KV cache (``raas.kv_cache_gib``; unset,
  ``VLLM_CPU_KVCACHE_SPACE`` GiB, else ``gpu_memory_utilization`` of the machine) + its
  engine-core process;
- ``raas=sim``: no model;
- every engine: the version being loaded (parameters x ``export_dtype`` bytes).

An engine on a GPU keeps weights and cache there. An evaluator with ``eval_deferred``
starts its engines once its trainer is done, so it counts as a process alone; a task
without a held-out split has no evaluator. The data
layer holds ``dataflow.buffer_capacity`` trajectories a policy (16 bytes a token).
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from astraflow.launch.machine import MemoryCgroup, machine_memory, memory_cgroup
from astraflow.models.checkpoint import FALLBACK_DTYPE, declared_dtype, model_config

GIB = 1 << 30
#: a Python process that imported torch and transformers (a forked component's RSS
#: counts the pages it shares with the preloaded parent too)
TORCH_PROCESS = int(0.4 * GIB)
#: a Python process without torch: the launcher, the data layer, a Ray actor
PLAIN_PROCESS = int(0.15 * GIB)
#: a local Ray cluster's own processes (GCS, raylet, dashboard agent)
RAY_CLUSTER = int(1.0 * GIB)
#: bytes of one element of each safetensors dtype
DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "BF16": 2,
               "F16": 2, "I16": 2, "U16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1,
               "BOOL": 1}
#: bytes of one element of a setting's dtype name
NAMED_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
#: a safetensors header larger than this is not one (a corrupt length)
MAX_HEADER_BYTES = 100 * 1024 * 1024
#: copies of the weights and AdamW moments a trainer holds while it writes a checkpoint
#: (trainer=hf through torch.distributed.checkpoint's Hugging Face writer; measured on a
#: 196M-parameter Qwen2: 4.4 GiB above its resident 4.05 GiB, twice the 12 B/param
#: written)
CHECKPOINT_COPIES = 2
#: tokens of a prompt when neither the task nor the sampled prompts say
DEFAULT_PROMPT_TOKENS = 256


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def available(limit: int, where: str) -> str:
    """``this machine has 23.5 GiB``, ``its cgroup (memory.max of PATH) allows 4.0 GiB``:
    :func:`machine_memory`'s answer in words."""
    return (f"this machine has {gib(limit)}" if where == "this machine"
            else f"{where} allows {gib(limit)}")


def count(n: int) -> str:
    """``494M``, ``1.54B``, ``860K``."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            value = n / size
            return f"{value:.3g}{unit}" if value < 100 else f"{value:.0f}{unit}"
    return str(n)


# -- the checkpoint ----------------------------------------------------------------------

@dataclass(frozen=True)
class Checkpoint:
    """What the estimate needs of a model: from its safetensors headers and config.json."""

    parameters: int
    #: the dtype most of its parameters are stored in (``BF16``)
    dtype: str = "F32"
    #: the dtype its config.json declares (``bfloat16``), which ``raas.dtype=auto``
    #: serves it in; None: it declares none
    declared_dtype: str | None = None
    hidden: int = 0
    layers: int = 0
    vocab: int = 0
    intermediate: int = 0
    #: width of one layer's keys (= of its values): key-value heads x head size
    kv_width: int = 0
    max_positions: int = 0
    #: linear modules (2-D ``.weight`` outside embeddings and experts) -> (out, in)
    linear: dict[str, tuple[int, int]] = field(default_factory=dict)


def read_header(path: Path) -> dict[str, Any]:
    """A safetensors file's JSON header (its first 8 + n bytes; the data is not read)."""
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than its header)")
        (size,) = struct.unpack("<Q", raw)
        if size > MAX_HEADER_BYTES:
            raise ValueError(f"{path}: not a safetensors file (a header of {size} bytes)")
        header = json.loads(fh.read(size))
    if not isinstance(header, dict):
        raise ValueError(f"{path}: not a safetensors file (its header is no map)")
    return header


def read_checkpoint(model_dir: str | Path) -> Checkpoint | None:
    """The parameters, dtype and shapes of ``model_dir``'s ``*.safetensors`` (every
    shard; headers only) and the sizes its ``config.json`` declares; None without
    safetensors (a format the estimate cannot read cheaply)."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        return None
    total = 0
    by_dtype: dict[str, int] = {}
    linear: dict[str, tuple[int, int]] = {}
    for file in files:
        try:
            header = read_header(file)
        except (OSError, ValueError):
            return None  # the engines say what is wrong with the file
        for name, info in header.items():
            if name == "__metadata__" or not isinstance(info, dict):
                continue
            shape = [int(d) for d in info.get("shape", [])]
            n = math.prod(shape)
            total += n
            by_dtype[str(info.get("dtype"))] = by_dtype.get(str(info.get("dtype")), 0) + n
            if (name.endswith(".weight") and len(shape) == 2 and "embed" not in name
                    and ".experts." not in name):
                linear[name[: -len(".weight")]] = (shape[0], shape[1])
    config = model_config(model_dir)
    hidden = int(config.get("hidden_size") or 0)
    heads = int(config.get("num_attention_heads") or 0)
    head_dim = int(config.get("head_dim") or (hidden // heads if heads else 0))
    kv_heads = int(config.get("num_key_value_heads") or heads)
    return Checkpoint(
        parameters=total,
        dtype=max(by_dtype, key=lambda d: by_dtype[d]) if by_dtype else "F32",
        declared_dtype=declared_dtype(config),
        hidden=hidden,
        layers=int(config.get("num_hidden_layers") or 0),
        vocab=int(config.get("vocab_size") or 0),
        intermediate=int(config.get("intermediate_size") or 4 * hidden),
        kv_width=kv_heads * head_dim,
        max_positions=int(config.get("max_position_embeddings") or 0),
        linear=linear,
    )


def tiny_checkpoint(model: Any, vocab: int = 128) -> Checkpoint:
    """The built-in tiny Llama of ``model`` (:class:`~astraflow.schema.ModelConfig`),
    before it is made: its size follows from the settings (its vocabulary is a few
    dozen characters; ``vocab`` bounds it)."""
    h, inter, layers = int(model.hidden_size), int(model.intermediate_size), int(model.num_layers)
    per_layer = 4 * h * h + 3 * h * inter + 2 * h
    linear = {f"model.layers.{i}.{m}": (o, n) for i in range(layers)
              for m, (o, n) in (("self_attn.q_proj", (h, h)), ("self_attn.k_proj", (h, h)),
                                ("self_attn.v_proj", (h, h)), ("self_attn.o_proj", (h, h)),
                                ("mlp.gate_proj", (inter, h)), ("mlp.up_proj", (inter, h)),
                                ("mlp.down_proj", (h, inter)))}
    return Checkpoint(parameters=2 * vocab * h + layers * per_layer + h, dtype="F32",
                      declared_dtype="float32",
                      hidden=h, layers=layers, vocab=vocab, intermediate=inter,
                      kv_width=h, max_positions=int(model.max_position_embeddings),
                      linear=linear)


def adapter_parameters(ckpt: Checkpoint, rank: int, targets: list[str] | str) -> int:
    """Parameters of rank-``rank`` LoRA adapters on the linear modules ``targets`` names
    (``all-linear``: every one but the output head, as peft does)."""
    from astraflow.lora import matches
    from astraflow.rl.options import ALL_LINEAR

    if targets == ALL_LINEAR:
        chosen = [m for m in ckpt.linear if not m.endswith("lm_head")]
    else:
        chosen = [m for m in ckpt.linear if any(matches(m, t) for t in targets)]
    return sum(rank * (out + inp) for m in chosen for out, inp in [ckpt.linear[m]])


# -- the estimate ------------------------------------------------------------------------

@dataclass(frozen=True)
class Term:
    """One share of a component's memory: what it is, its bytes, how it was counted."""

    what: str
    bytes: int
    how: str = ""

    def said(self) -> str:
        return f"{self.what} {gib(self.bytes)}" + (f" ({self.how})" if self.how else "")


@dataclass(frozen=True)
class Part:
    """``count`` components alike (``raas-*``: the rollout nodes), each of ``terms``."""

    name: str
    terms: tuple[Term, ...]
    count: int = 1
    #: the settings that lower it, for the line that refuses a run
    advice: str = ""

    @property
    def each(self) -> int:
        return sum(t.bytes for t in self.terms)

    @property
    def bytes(self) -> int:
        return self.count * self.each

    def said(self, detail: bool = False) -> str:
        what = f"{self.count} {self.name}" if self.count != 1 else self.name
        each = f", {gib(self.each)} each" if self.count > 1 else ""
        out = f"{what} {gib(self.bytes)}{each}"
        if detail:
            big = sorted(self.terms, key=lambda t: -t.bytes)
            out += ": " + ", ".join(t.said() for t in big if t.bytes >= 0.05 * self.each)
        return out


@dataclass(frozen=True)
class Estimate:
    """A run's estimated peak, component by component (:func:`estimate`)."""

    parts: tuple[Part, ...]
    #: the sequence length the activations and caches were counted for
    sequence_tokens: int = 0

    @property
    def bytes(self) -> int:
        return sum(p.bytes for p in self.parts)

    def biggest(self) -> Part:
        return max(self.parts, key=lambda p: p.each)

    def said(self) -> str:
        """The breakdown in one line, the biggest component first and in detail."""
        first = self.biggest()
        rest = sorted((p for p in self.parts if p is not first), key=lambda p: -p.bytes)
        return "; ".join([first.said(detail=True), *(p.said() for p in rest)])

    def table(self) -> list[dict[str, Any]]:
        """Each component and term as records (a benchmark, the docs)."""
        return [{"component": p.name, "count": p.count, "bytes_each": p.each,
                 "terms": {t.what: t.bytes for t in p.terms}} for p in self.parts]


def dtype_bytes(name: str | None, ckpt: Checkpoint) -> int:
    """Bytes an element of a setting's dtype (``auto``: the checkpoint's)."""
    if name in NAMED_BYTES:
        return NAMED_BYTES[str(name)]
    return DTYPE_BYTES.get(ckpt.dtype, 4)


def engine_dtype(raas: Any, ckpt: Checkpoint) -> str | None:
    """The dtype an engine of ``raas`` holds the weights in: ``raas.dtype``, its ``auto``
    resolved as the engines resolve it (:func:`~astraflow.models.checkpoint.served_dtype`:
    the dtype the checkpoint declares, else float32); None for an engine without the
    setting (``raas=sglang``: its server's own choice)."""
    if "dtype" not in raas:
        return None
    setting = raas.get("dtype")
    if setting and setting != "auto":
        return str(setting)
    return ckpt.declared_dtype or FALLBACK_DTYPE


def sequence_tokens(cfg: DictConfig, ckpt: Checkpoint, prompt_tokens: int | None) -> int:
    """Tokens of the longest sequence a step trains on, as estimated: the prompt
    (``task.max_prompt_tokens``, else the longest of the prompts sampled in pre-flight)
    and what the workflow lets each turn generate, times its turns (and once more for a
    workflow of several roles, where one reads another's answer)."""
    task, workflow = cfg.get("task") or {}, cfg.get("workflow") or {}
    prompt = task.get("max_prompt_tokens") or prompt_tokens or DEFAULT_PROMPT_TOKENS
    new = max([int(v) for k, v in workflow.items()
               if str(k).endswith(("max_new_tokens", "max_tokens")) and isinstance(v, int)]
              or [DEFAULT_PROMPT_TOKENS])
    turns = int(workflow.get("max_turns") or 1)
    roles = len(cfg.get("policies") or {"policy": None})
    tokens = int(prompt) + new * (turns + (1 if roles > 1 else 0))
    return min(tokens, ckpt.max_positions) if ckpt.max_positions else tokens


def has_gpu() -> bool:
    """Whether this machine has a GPU for the components to use (torch-free: the
    drivers' files; ``CUDA_VISIBLE_DEVICES=""`` hides them)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    gpus = Path("/proc/driver/nvidia/gpus")
    try:
        return (gpus.is_dir() and any(gpus.iterdir())) or Path("/dev/kfd").exists()
    except OSError:
        return False


def _on_gpu(device: str | None, gpu: bool) -> bool:
    device = str(device or "auto")
    return device.startswith("cuda") or (device == "auto" and gpu)


def trainer_activations(cfg: DictConfig, t: Any, ckpt: Checkpoint, seq: int) -> tuple[int, str]:
    """Bytes the micro-batches of a trainer's ranks (settings ``t``) keep for their
    backward passes at once, and the micro-batch counted."""
    ranks = int(t.get("world_size", 1) or 1)
    per_rank = max(1, math.ceil(int(cfg.batch_size) / ranks))
    budget = int(t.get("micro_batch_tokens", 0) or 0)
    sequences = min(int(t.get("micro_batch_size", 64)), per_rank)
    tokens = max(budget, seq) if budget else sequences * seq
    shape = (f"{budget} tokens a micro-batch" if budget
             else f"{sequences} x {seq} tokens a micro-batch")
    master = dtype_bytes(t.get("dtype", "float32"), ckpt)
    compute = 2 if t.get("mixed_precision", "none") == "bfloat16" else master
    layer = (10 * ckpt.hidden + 4 * ckpt.intermediate) * compute
    if t.get("activation_checkpointing", False):
        kept = tokens * (ckpt.layers * ckpt.hidden * compute + layer)
    else:
        kept = tokens * ckpt.layers * layer
    logits = tokens * ckpt.vocab * 4 * 3
    return ranks * (logits + kept), shape + (f" on each of {ranks} ranks" if ranks > 1 else "")


def trainer_part(cfg: DictConfig, policy: str, ckpt: Checkpoint, seq: int, gpu: bool) -> Part:
    """One policy's trainer (every rank of it)."""
    from astraflow.components import trainer_settings
    from astraflow.rl.options import lora_rank, lora_targets

    t = trainer_settings(cfg, policy)
    ranks = int(t.get("world_size", 1) or 1)
    master = dtype_bytes(t.get("dtype", "float32"), ckpt)
    export = dtype_bytes(t.get("export_dtype", "bfloat16"), ckpt)
    rank = lora_rank(t)
    params = ckpt.parameters
    trained = adapter_parameters(ckpt, rank, lora_targets(t.lora)) if rank else params
    dtype_name = "float32" if master == 4 else "bfloat16"
    terms = []
    if rank:
        terms.append(Term("frozen base", params * master,
                          f"{count(params)} parameters x {master} B"))
        terms.append(Term("adapters and AdamW", trained * 4 * master,
                          f"{count(trained)} adapter parameters x {4 * master} B"))
    else:
        terms.append(Term("weights, grads and AdamW", params * 4 * master,
                          f"{count(params)} parameters x {4 * master} B for {dtype_name} "
                          "AdamW"))
    if t.get("kl_coef", 0) and not rank:
        terms.append(Term("KL reference", params * master, "trainer.kl_coef > 0"))
    terms.append(Term("published copy", (trained if rank else params) * export))
    device = t.get("device", "auto") if t.get("name") == "hf" else "auto"
    on_gpu = _on_gpu(device, gpu)
    if on_gpu and not t.get("cpu_offload", False):  # states and activations on the GPU
        terms = [term for term in terms if term.what == "published copy"]
    activations, shape = trainer_activations(cfg, t, ckpt, seq)
    # a checkpoint is written between steps, when the activations are freed: the larger
    # of the two is the peak
    saved = (params + 2 * trained) * master
    # trainer=hf in one process writes its checkpoint from the tensors themselves; a
    # sharded one (torch.distributed.checkpoint) serialises it in memory first
    written = 0 if t.get("name") == "hf" and ranks == 1 else CHECKPOINT_COPIES * saved
    if not on_gpu or t.get("cpu_offload", False):
        if written > activations:
            terms.append(Term("checkpoint being written", written,
                              f"{CHECKPOINT_COPIES} copies of {count(params)} parameters "
                              f"and moments, {saved / max(params, 1):.0f} B each; more "
                              f"than the activations' {gib(activations)}"))
        elif not on_gpu:
            terms.append(Term("activations", activations, shape))
    terms.append(Term("processes", ranks * TORCH_PROCESS + (PLAIN_PROCESS if ranks > 1 else 0),
                      f"{ranks} ranks" if ranks > 1 else ""))
    advice = _trainer_advice(t, activations_first=not on_gpu and activations >= written,
                             lora=bool(rank), fp32=master == 4)
    return Part(f"trainer-{policy}", tuple(terms), advice=advice)


def _trainer_advice(t: Any, *, activations_first: bool, lora: bool, fp32: bool) -> str:
    """What lowers a trainer's peak, most telling first."""
    advice = []
    if activations_first:
        advice.append(f"lower trainer.micro_batch_size (now {t.get('micro_batch_size')}) "
                      "or set trainer.micro_batch_tokens")
        if t.get("name") == "hf" and not t.get("activation_checkpointing", False):
            advice.append("set trainer.activation_checkpointing=true")
    if not lora:
        advice.append("use trainer.lora.rank=16" + (" or trainer.dtype=bfloat16"
                                                    if fp32 else ""))
    if t.get("kl_coef", 0) and not lora:
        advice.append("set trainer.kl_coef=0 (no reference copy)")
    if not advice:
        advice.append("lower trainer.micro_batch_size")
    return ", ".join(advice)


#: what raas=hf holds of a version while loading it (its refresh's read buffer)
HF_LOAD_CHUNK = 32 * 2**20


def engine_terms(cfg: DictConfig, ckpt: Checkpoint, seq: int, gpu: bool,
                 machine: int) -> list[Term]:
    """One engine of ``cfg.raas`` serving ``ckpt``, as a node or an evaluator holds it."""
    raas = cfg.raas
    name = str(raas.get("name"))
    export = dtype_bytes(cfg.trainer.get("export_dtype", "bfloat16"), ckpt)
    if name == "sim":
        return []
    loading = Term("version being loaded", ckpt.parameters * export)
    engine = dtype_bytes(engine_dtype(raas, ckpt), ckpt)
    weights = Term("weights", ckpt.parameters * engine,
                   f"{count(ckpt.parameters)} parameters x {engine} B")
    if name == "vllm":
        if gpu:
            return [loading, Term("engine core", TORCH_PROCESS)]
        if raas.get("kv_cache_gib") is not None:
            cache, how = int(float(raas.kv_cache_gib) * GIB), "raas.kv_cache_gib"
        elif os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            cache = int(float(os.environ["VLLM_CPU_KVCACHE_SPACE"]) * GIB)
            how = "VLLM_CPU_KVCACHE_SPACE"
        else:
            cache = int(float(raas.get("gpu_memory_utilization", 0.5)) * machine)
            how = "raas.gpu_memory_utilization of the machine"
        return [weights, Term("KV cache", cache, how), loading,
                Term("engine core", TORCH_PROCESS)]
    if name == "hf":  # a refresh streams the file in, a chunk at a time
        loading = Term("version being loaded", min(ckpt.parameters * export, HF_LOAD_CHUNK),
                       "read a chunk at a time")
    if name == "hf" and _on_gpu(raas.get("device"), gpu):
        return [loading]
    if name == "sglang" and gpu:
        return [loading, Term("server", TORCH_PROCESS)]
    batch = min(int(raas.get("max_batch_size", 256)),
                int(cfg.node_concurrency) * int(cfg.group_size))
    cache = batch * seq * ckpt.layers * 2 * ckpt.kv_width * engine
    logits = batch * ckpt.vocab * 4 * 2
    terms = [weights, Term("KV cache", cache + logits, f"{batch} sequences x {seq} tokens"),
             loading]
    kept = float(raas.get("prefix_cache_gib", 0.0) or 0.0)
    if kept > 0 and seq >= int(raas.get("prefix_cache_min_tokens", 1024)):
        # past turns' keys and values, kept for a conversation's next turn
        terms.append(Term("prefix cache", min(int(kept * GIB), cache),
                          "raas.prefix_cache_gib"))
    return terms


def node_count(cfg: DictConfig) -> int:
    """The rollout nodes the launcher starts (and may grow to, with ``autoscale``): the
    local launcher's ``num_nodes``, or the nodes of every Ray pool."""
    launcher = cfg.get("launcher") or {}
    grow = int(cfg.max_nodes) if cfg.get("autoscale") else 0
    if launcher.get("kind") == "ray":
        from astraflow.launcher_options import PoolConfig

        pools = launcher.get("pools") or {}
        if not pools:
            return max(int(cfg.num_nodes), grow)
        default = PoolConfig().nodes
        return sum(max(int(p.get("nodes", default)), grow) for p in pools.values())
    return max(int(cfg.num_nodes), grow)


def estimate(cfg: DictConfig, ckpt: Checkpoint | None = None, *,
             prompt_tokens: int | None = None, gpu: bool | None = None,
             machine: int | None = None, evaluated: bool = True) -> Estimate:
    """The run's peak, component by component, for the config the launcher uses
    (policies resolved). ``ckpt``: read from ``model.path`` (the built-in tiny model's
    when unset); ``prompt_tokens``: the longest prompt sampled; ``gpu``: whether the
    machine has one (:func:`has_gpu`); ``machine``: its memory (:func:`machine_memory`),
    which sizes a vLLM cache given as a fraction of it; ``evaluated``: whether an evaluator
    is started per policy (not when the task has no held-out split)."""
    from astraflow.components import policy_names

    if ckpt is None:
        path = cfg.model.get("path")
        ckpt = read_checkpoint(path) if path else tiny_checkpoint(cfg.model)
        if ckpt is None:
            ckpt = Checkpoint(parameters=0)
    gpu = has_gpu() if gpu is None else gpu
    machine = machine_memory()[0] if machine is None else machine
    seq = sequence_tokens(cfg, ckpt, prompt_tokens)
    policies = policy_names(cfg)
    engines = 1 if _lora(cfg) else len(policies)
    engine = engine_terms(cfg, ckpt, seq, gpu, machine)
    served = tuple(Term(f"{t.what}" + (f" x {engines} engines" if engines > 1 else ""),
                        t.bytes * engines, t.how) for t in engine)
    engine_advice = ("lower num_nodes" + (", raas.max_batch_size or node_concurrency"
                                          if cfg.raas.get("name") == "hf" else
                                          ", raas.kv_cache_gib"
                                          if cfg.raas.get("name") == "vllm" else "")
                     + (", or raas.dtype=bfloat16"
                        if engine_dtype(cfg.raas, ckpt) == "float32" else ""))
    parts = [trainer_part(cfg, p, ckpt, seq, gpu) for p in policies]
    nodes = node_count(cfg)
    if nodes:
        parts.append(Part("rollout nodes" if nodes > 1 else "rollout node",
                          (Term("process", TORCH_PROCESS), *served), count=nodes,
                          advice=engine_advice))
    deferred = bool(cfg.get("eval_deferred", False))
    for p in policies if evaluated else ():
        parts.append(Part(f"eval-{p}", (Term("process", TORCH_PROCESS),
                                        *(() if deferred else served)),
                          advice="eval_deferred=true" if not deferred else ""))
    buffered = (int(cfg.dataflow.get("buffer_capacity", 4096)) * len(policies) * seq * 16)
    launcher = cfg.get("launcher") or {}
    fixed = [Term("launcher", PLAIN_PROCESS), Term("data layer", PLAIN_PROCESS + buffered)]
    if launcher.get("kind") == "ray":
        components = 1 + (2 if evaluated else 1) * len(policies) + nodes
        fixed += [Term("Ray", RAY_CLUSTER), Term("Ray actors", components * PLAIN_PROCESS)]
    elif launcher.get("preload", False):
        fixed.append(Term("preloaded parent", TORCH_PROCESS))
    parts.append(Part("launcher and data layer", tuple(fixed)))
    return Estimate(tuple(parts), sequence_tokens=seq)


def _lora(cfg: DictConfig) -> bool:
    from astraflow.rl.options import lora_rank

    return bool(lora_rank(cfg.trainer))


__all__ = ["MemoryCgroup", "estimate", "machine_memory", "memory_cgroup", "read_checkpoint"]
