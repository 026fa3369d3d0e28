"""Not implemented yet: selecting this option fails with a clear message."""

from astraflow.errors import NotAvailableYetError

raise NotAvailableYetError(
    "trainer=megatron is registered by astraflow-plugin-trainer-megatron but not available yet "
    "(tracked as issue 10)"
)
