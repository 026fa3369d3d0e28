"""The test tiers hold by themselves: a unit test that starts a process, or runs past
the tier's limit, fails and says why; tiers come from directories."""

from __future__ import annotations

from pathlib import Path

ROOT_CONFTEST = Path(__file__).resolve().parents[3] / "conftest.py"

UNIT_TESTS = '''
import subprocess
import time


def test_quick():
    assert sum(range(4)) == 6


def test_starts_a_process():
    subprocess.run(["true"], check=True)


def test_slow():
    time.sleep(1.0)
'''


def test_a_unit_test_that_spawns_or_is_slow_fails_naming_why(pytester):
    # the project's conftest, with the unit limit cut to 0.3 s so the slow test is quick
    # (it sleeps 1 s: a loaded machine's wait for a core, taken off its time, can be
    # counted generously, and a half-second sleep once passed as 0.3 s)
    pytester.makeconftest(ROOT_CONFTEST.read_text().replace("UNIT_SECONDS = 5.0",
                                                            "UNIT_SECONDS = 0.3"))
    (pytester.path / "tests" / "unit").mkdir(parents=True)
    (pytester.path / "tests" / "system").mkdir()
    (pytester.path / "tests" / "unit" / "test_things.py").write_text(UNIT_TESTS)
    (pytester.path / "tests" / "system" / "test_things_too.py").write_text(UNIT_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rf")
    # the same three tests pass in the system tier, two fail in the unit tier
    result.assert_outcomes(passed=4, failed=2)
    result.stdout.fnmatch_lines([
        "*unit/test_things.py::test_starts_a_process is in the unit tier, but it started a "
        "process (subprocess.Popen*",
        "*unit/test_things.py::test_slow is in the unit tier, but it took * s (a unit test "
        "takes at most 0.3 s)*"])
    unit = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-m", "unit", "-q")
    assert unit.parseoutcomes() == {"passed": 1, "failed": 2, "deselected": 3}


def test_a_test_outside_the_tiers_is_refused(pytester):
    pytester.makeconftest(ROOT_CONFTEST.read_text())
    (pytester.path / "tests" / "misc").mkdir(parents=True)
    (pytester.path / "tests" / "misc" / "test_x.py").write_text("def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.stderr.fnmatch_lines(["*test_x.py: a test belongs under tests/<tier>/*"])
