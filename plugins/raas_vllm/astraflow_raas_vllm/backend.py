"""Not implemented yet: selecting this option fails with a clear message."""

from astraflow.errors import NotAvailableYetError

raise NotAvailableYetError(
    "raas=vllm is registered by astraflow-plugin-raas-vllm but not available yet "
    "(tracked as issue 7)"
)
