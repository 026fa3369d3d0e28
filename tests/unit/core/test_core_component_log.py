"""What the launcher quotes of a component that failed: the error, not what an exiting
interpreter printed after it."""

from __future__ import annotations

from astraflow.launch.local import Child

LEAK_REPORT = """\
nanobind: leaked 4 instances!
 - leaked instance 0x7f450060bd48 of type "triton._C.libtriton.ir.attribute"
nanobind: leaked 64 types!
 - leaked type "triton._C.libtriton.ir.location"
 - ... skipped remainder
nanobind: leaked 513 functions!
 - leaked function "set_insertion_point_to_start"
nanobind: this is likely caused by a reference counting issue in the binding code.
See https://nanobind.readthedocs.io/en/latest/refleaks.html
"""


def test_the_log_tail_quotes_the_error_above_a_leak_report(tmp_path):
    log = tmp_path / "raas-0.log"
    log.write_text("loading the task\nastraflow: config error: Missing key latency\n"
                   "    full_key: workflow.latency\n" + LEAK_REPORT * 3)
    child = Child("raas-0", (), proc=None, log=log)
    assert child.log_tail(lines=3) == ("  | loading the task\n"
                                       "  | astraflow: config error: Missing key latency\n"
                                       "  |     full_key: workflow.latency")
