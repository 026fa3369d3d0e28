"""Not implemented yet: selecting this option fails with a clear message."""

from astraflow.errors import NotAvailableYetError

raise NotAvailableYetError(
    "data=greso is registered by astraflow-plugin-data-greso but not available yet "
    "(tracked as issue 8)"
)
