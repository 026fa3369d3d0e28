"""``workflow=compat_prefixed`` passes AstraFlow's shared workflow contract."""

from astraflow.testing.contracts import WorkflowContract


class TestPrefixed(WorkflowContract):
    option = "compat_prefixed"
    settings = {"prompt_prefix": "q:"}
