"""Errors of the SGLang backend, printed by the CLI without a traceback."""

from astraflow.errors import AstraFlowError

INSTALL_HINT = (
    "raas=sglang needs SGLang, which installs only on a GPU (CUDA) machine: there, run "
    "pip install 'astraflow-plugin-raas-sglang[gpu]'. This machine has no 'sglang' module "
    "(SGLang's CPU backend needs a source build of its kernels); use raas=hf or raas=vllm here."
)


class SGLangUnavailableError(AstraFlowError):
    """SGLang is not installed where the backend was selected."""


class SGLangServerError(AstraFlowError):
    """The SGLang server failed, refused a request, or answered something unusable."""
