"""Not implemented yet: selecting this option fails with a clear message."""

from astraflow.errors import NotAvailableYetError

raise NotAvailableYetError(
    "raas=hf is registered by astraflow-plugin-raas-hf but not available yet (tracked as issue 5)"
)
