"""``logger=compat_jsonl`` passes AstraFlow's shared logger contract."""

from astraflow.testing.contracts import LoggerContract


class TestJsonl(LoggerContract):
    option = "compat_jsonl"
