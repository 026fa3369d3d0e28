"""Not implemented yet: selecting this option fails with a clear message."""

from astraflow.errors import NotAvailableYetError

raise NotAvailableYetError(
    "trainer=hf is registered by astraflow-plugin-trainer-hf but not available yet "
    "(tracked as issue 5)"
)
