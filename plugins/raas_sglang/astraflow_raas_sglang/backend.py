"""Not implemented yet: selecting this option fails with a clear message."""

from astraflow.errors import NotAvailableYetError

raise NotAvailableYetError(
    "raas=sglang is registered by astraflow-plugin-raas-sglang but not available yet "
    "(tracked as issue 9)"
)
