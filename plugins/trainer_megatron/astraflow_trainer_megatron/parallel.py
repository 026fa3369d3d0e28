"""Process groups for Megatron, and the CPU mode used when CUDA is absent.

Megatron-core assumes CUDA in three places that matter for a dense GPT: it asks
``torch.cuda.current_device()`` for the device of buffers it makes (RoPE frequencies,
attention scratch), its RNG tracker forks CUDA RNG states, and its default causal
mask is built on ``"cuda"``. CPU mode answers ``"cpu"`` for the device only while
Megatron code runs (:func:`megatron_device`), uses the no-op inference RNG tracker
(dropout is off, so there is nothing to fork), and the backend always passes an
explicit mask. None of it happens when CUDA exists.

Under ``torchrun`` the process group comes from the environment (NCCL on GPUs, gloo
on CPUs, where tensor and data parallelism work too), the tensor-parallel size from
the config, and the ranks left over are data-parallel replicas; alone (no
``WORLD_SIZE``) a trainer is world size 1 on ``127.0.0.1``.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator

import torch
import torch.distributed as dist

from astraflow_trainer_megatron import importing_megatron

with importing_megatron():
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

#: Megatron's RNG tracker needs a seed; weights come from a checkpoint and dropout is
#: off, so no result depends on it
_RNG_SEED = 1234


def cpu_mode() -> bool:
    return not torch.cuda.is_available()


@contextlib.contextmanager
def megatron_device() -> Iterator[None]:
    """While Megatron code runs without CUDA, ``torch.cuda.current_device()`` is "cpu".

    Scoped to the calls that need it and restored afterwards, so no other code in the
    process (another backend, a test) ever sees the patched function; with CUDA this
    does nothing.
    """
    if not cpu_mode():
        yield
        return
    real = torch.cuda.current_device
    torch.cuda.current_device = lambda: "cpu"
    try:
        yield
    finally:
        torch.cuda.current_device = real


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def initialize(tensor_parallel: int, pipeline_parallel: int,
               timeout_minutes: int = 10, expert_parallel: int = 1) -> torch.device:
    """Process group + Megatron's model-parallel groups; returns this rank's device.

    Idempotent within a process: a second backend (a KL reference, a test) reuses the
    groups when the sizes agree and is refused when they do not.
    """
    if tensor_parallel * pipeline_parallel != 1 and "WORLD_SIZE" not in os.environ:
        raise ValueError(
            f"trainer.tensor_model_parallel_size={tensor_parallel} x "
            f"pipeline_model_parallel_size={pipeline_parallel} needs one process per rank: "
            f"set trainer.world_size, or start the trainer with torchrun --nproc-per-node "
            f"{tensor_parallel * pipeline_parallel}"
        )
    if not cpu_mode():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    if not dist.is_initialized():
        backend = "gloo" if cpu_mode() else "nccl"
        if "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend, init_method="env://")
        else:
            dist.init_process_group(
                backend, init_method=f"tcp://127.0.0.1:{_free_port()}", world_size=1, rank=0
            )
    if dist.get_world_size() % (tensor_parallel * pipeline_parallel):
        raise ValueError(
            f"world size {dist.get_world_size()} is not a multiple of "
            f"trainer.tensor_model_parallel_size={tensor_parallel} x "
            f"pipeline_model_parallel_size={pipeline_parallel}"
        )
    if parallel_state.model_parallel_is_initialized():
        have = (
            parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_pipeline_model_parallel_world_size(),
            parallel_state.get_expert_model_parallel_world_size(),
        )
        if have != (tensor_parallel, pipeline_parallel, expert_parallel):
            raise ValueError(
                f"this process already runs Megatron with tensor/pipeline/expert parallel "
                f"sizes {have}, not {(tensor_parallel, pipeline_parallel, expert_parallel)}"
            )
    else:
        with megatron_device():
            parallel_state.initialize_model_parallel(
                tensor_parallel, pipeline_parallel, distributed_timeout_minutes=timeout_minutes,
                expert_model_parallel_size=expert_parallel)
            model_parallel_cuda_manual_seed(_RNG_SEED, inference_rng_tracker=cpu_mode())
    return torch.device("cpu") if cpu_mode() else torch.device("cuda", torch.cuda.current_device())
