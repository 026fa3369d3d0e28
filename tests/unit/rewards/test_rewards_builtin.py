"""The built-in rewards: math answers by value, a regex, and a function in the user's file."""

from __future__ import annotations

import asyncio
import inspect
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest

from astraflow.errors import ConfigError
from astraflow.rewards.math import MathReward, as_number, extract_answer, ground_truth
from astraflow.rewards.python import PythonReward, PythonRewardConfig
from astraflow.rewards.regex import RegexConfig, RegexReward
from astraflow.types import Task


def task(answer: str | None, **metadata) -> Task:
    return Task("t1", "question", answer, task_type="gsm8k", metadata=metadata)


# -- final-answer extraction ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so \boxed{\frac{1}{2}}.", r"\frac{1}{2}"),
        (r"first \boxed{1}, finally \boxed{\frac{a^{2}}{b_{1}}} done", r"\frac{a^{2}}{b_{1}}"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
        (r"\fbox{7}", "7"),
        (r"\boxed{3} and then \boxed{4", "3"),  # the last one was cut off
        ("Natalia sold 72 clips.\n#### 72", "72"),
        ("#### 1,234.\n\nThat is all.", "1,234"),
        ("#### 5 then #### 6", "6"),
        ("2 apples and 3 pears make 5", "5"),
        ("the temperature fell to -7", "-7"),
        ("5-3 = 2", "2"),
        ("she paid 1,234,567 dollars", "1234567"),
        ("pi is about 3.14.", "3.14"),
        ("three quarters: 3/4", "3/4"),
        ("no answer here", None),
        ("", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_the_ground_truth_is_extracted_only_when_it_is_boxed_or_a_solution():
    assert ground_truth(r"\frac{1}{2}") == r"\frac{1}{2}"  # not its last number, 2
    assert ground_truth(r"\boxed{42}") == "42"
    assert ground_truth("Natalia sold 48/2 = 24 clips.\n#### 72") == "72"


def test_plain_numbers_are_exact():
    assert as_number("1,000") == 1000
    assert as_number("0.5") == as_number("1/2")
    assert as_number("-3") == -3
    assert as_number(r"\frac{1}{2}") is None
    assert as_number("1/0") is None


# -- math equivalence -------------------------------------------------------------------

@pytest.fixture(scope="module")
def math_reward() -> MathReward:
    pytest.importorskip("math_verify")
    return MathReward()


@pytest.mark.parametrize(
    ("answer", "completion"),
    [
        (r"\frac{1}{2}", r"The answer is \boxed{0.5}."),
        (r"\frac{1}{2}", r"so \boxed{1/2}"),
        ("0.5", r"\boxed{\frac{1}{2}}"),
        (r"\boxed{2}", "which gives 2.0"),
        ("#### 1,000", "in total 1000 apples"),
        ("72", "Natalia sold 72 clips.\n#### 72"),
        (r"\sqrt{2}", r"\boxed{2^{1/2}}"),
        ("x^2 + 1", r"\boxed{1 + x^{2}}"),
    ],
)
def test_equal_values_score_one(math_reward, answer, completion):
    assert math_reward(task(answer), completion) == {"score": 1.0, "answer_found": 1.0}


@pytest.mark.parametrize(
    ("answer", "completion"),
    [("3", r"\boxed{4}"), (r"\frac{1}{2}", r"\boxed{\frac{1}{3}}"), ("72", "#### 27")],
)
def test_different_values_score_zero(math_reward, answer, completion):
    assert math_reward(task(answer), completion) == {"score": 0.0, "answer_found": 1.0}


def test_no_answer_at_all_is_reported_apart(math_reward):
    assert math_reward(task("3"), "I do not know.") == {"score": 0.0, "answer_found": 0.0}


def test_plain_numbers_do_not_need_math_verify(math_reward, monkeypatch):
    reward = MathReward()

    def no_parser(*args, **kwargs):
        raise AssertionError("math_verify was called")

    monkeypatch.setattr(reward, "_parse", no_parser)
    monkeypatch.setattr(reward, "_verify", no_parser)
    assert reward(task("#### 1,500"), "so 1500.0")["score"] == 1.0
    assert reward(task("0.75"), "3/4")["score"] == 1.0


def test_math_works_from_a_worker_thread(math_reward):
    # math-verify's own time limits use signal.alarm, which raises off the main thread
    def score(pair):
        assert threading.current_thread() is not threading.main_thread()
        return math_reward(task(pair[0]), pair[1])["score"]

    pairs = [(r"\frac{1}{2}", r"\boxed{0.5}"), (r"\sqrt{4}", r"\boxed{2}"), ("3", r"\boxed{4}")]
    with ThreadPoolExecutor(max_workers=2) as pool:
        assert list(pool.map(score, pairs)) == [1.0, 1.0, 0.0]


def test_a_number_too_large_to_evaluate_scores_zero_at_once(math_reward):
    result = {}
    thread = threading.Thread(
        target=lambda: result.update(math_reward(task("3"), r"\boxed{9^{9^{9^{9}}}}")),
        daemon=True,  # were the guard missing, SymPy would compute this for hours
    )
    thread.start()
    thread.join(timeout=30)
    assert result == {"score": 0.0, "answer_found": 1.0}


def test_a_task_without_an_answer_fails_the_sample(math_reward):
    with pytest.raises(ValueError, match="t1"):
        math_reward(task(None), r"\boxed{1}")


def test_math_without_math_verify_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # makes the import fail
    with pytest.raises(ConfigError, match=r"pip install 'astraflow\[math\]'"):
        MathReward()


# -- regex ------------------------------------------------------------------------------


def test_regex_compares_the_first_group():
    reward = RegexReward(RegexConfig(pattern=r"Answer:\s*(\w+)"))
    assert reward(task(" B "), "reasoning... Answer: B") == 1.0
    assert reward(task("B"), "reasoning... Answer: C") == 0.0
    assert reward(task("B"), "I refuse to answer") == 0.0


def test_regex_without_a_group_compares_the_whole_match_and_honours_flags():
    reward = RegexReward(RegexConfig(pattern=r"yes|no", flags="i"))
    assert reward(task("YES"), "I would say YES.") == 1.0
    assert reward(task("yes"), "I would say YES.") == 0.0  # the match is compared as is


def test_regex_needs_a_valid_pattern():
    with pytest.raises(ConfigError, match=r"reward\.pattern"):
        RegexReward(RegexConfig())
    with pytest.raises(ConfigError) as info:
        RegexReward(RegexConfig(pattern=r"Answer: (\d+"))
    message = str(info.value)
    assert "reward.pattern" in message and "missing )" in message and "\n" not in message
    with pytest.raises(ConfigError, match=r"reward\.flags"):
        RegexReward(RegexConfig(pattern="a", flags="q"))


def test_regex_reads_a_plain_namespace_config():
    # composed configs arrive as attribute objects, not necessarily the dataclass
    reward = RegexReward(SimpleNamespace(pattern=r"= (\d+)", flags=""))
    assert reward(task("4"), "2 + 2 = 4") == 1.0


# -- python -----------------------------------------------------------------------------


def reward_file(tmp_path: Path, source: str, name: str = "my_reward.py") -> Path:
    file = tmp_path / name
    file.write_text(inspect.cleandoc(source) + "\n")
    return file


def python_reward(file: Path, function: str = "score") -> PythonReward:
    return PythonReward(PythonRewardConfig(path=str(file), function=function))


def test_python_plain_function(tmp_path):
    file = reward_file(
        tmp_path,
        """
        def score(task, completion):
            return float(completion.strip() == task.answer)
        """,
    )
    reward = python_reward(file)
    assert reward(task("4"), " 4 ") == 1.0
    assert reward(task("4"), "5") == 0.0


def test_python_async_function_returns_an_awaitable(tmp_path):
    file = reward_file(
        tmp_path,
        """
        import asyncio

        async def judge(task, completion):
            await asyncio.sleep(0)
            return 0.25 if completion else 0.0
        """,
    )
    result = python_reward(file, "judge")(task("4"), "anything")
    assert inspect.isawaitable(result)
    assert asyncio.run(result) == 0.25


def test_python_dict_result_and_sibling_imports(tmp_path):
    (tmp_path / "helpers_for_reward.py").write_text("WEIGHT = 0.5\n")
    file = reward_file(
        tmp_path,
        """
        from helpers_for_reward import WEIGHT

        def score(task, completion):
            return {"score": 1.0, "length": len(completion) * WEIGHT}
        """,
    )
    path_before = list(sys.path)
    try:
        assert python_reward(file)(task("x"), "abcd") == {"score": 1.0, "length": 2.0}
        assert sys.path == path_before
    finally:
        sys.modules.pop("helpers_for_reward", None)


def test_python_verl_signature_gets_verl_arguments(tmp_path):
    file = reward_file(
        tmp_path,
        """
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            return {"score": float(solution_str == ground_truth),
                    "from_gsm8k": float(data_source == "openai/gsm8k"),
                    "split_is_train": float(extra_info["split"] == "train")}
        """,
    )
    reward = python_reward(file, "compute_score")
    row = task("72", data_source="openai/gsm8k", extra_info={"split": "train"})
    assert reward(row, "72") == {"score": 1.0, "from_gsm8k": 1.0, "split_is_train": 1.0}


def test_python_verl_defaults_without_those_columns(tmp_path):
    file = reward_file(
        tmp_path,
        """
        def compute_score(data_source, solution_str, ground_truth, extra_info):
            return float(data_source == "gsm8k" and extra_info == {} and ground_truth == "1")
        """,
    )
    assert python_reward(file, "compute_score")(task("1"), "1") == 1.0


def test_two_files_with_the_same_name_stay_apart(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    one = reward_file(tmp_path / "a", "def score(task, completion): return 1.0", "reward.py")
    two = reward_file(tmp_path / "b", "def score(task, completion): return 2.0", "reward.py")
    first, second = python_reward(one), python_reward(two)
    assert (first(task("x"), ""), second(task("x"), "")) == (1.0, 2.0)
    assert first.module.__name__ != second.module.__name__


def test_python_needs_a_path():
    with pytest.raises(ConfigError, match=r"reward=python needs reward.path=FILE"):
        PythonReward(PythonRewardConfig())


def test_python_missing_file_names_the_resolved_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        python_reward(Path("nowhere/reward.py"))
    assert str(tmp_path / "nowhere" / "reward.py") in str(info.value)


def test_python_syntax_error_names_the_file_and_line(tmp_path):
    file = reward_file(
        tmp_path,
        """
        def score(task, completion):
            return 1.0

        def broken(task completion):
            return 0.0
        """,
    )
    with pytest.raises(ConfigError) as info:
        python_reward(file)
    message = str(info.value)
    assert str(file) in message and "line 4" in message and "SyntaxError" in message
    assert "\n" not in message


def test_python_import_that_raises_names_the_file_the_error_and_line(tmp_path):
    file = reward_file(
        tmp_path,
        """
        import json

        TABLE = json.loads("{}")["missing"]

        def score(task, completion):
            return 1.0
        """,
    )
    with pytest.raises(ConfigError) as info:
        python_reward(file)
    message = str(info.value)
    assert str(file) in message and "KeyError" in message and "'missing'" in message
    assert "line 3" in message and "\n" not in message
    loaded = [getattr(module, "__file__", None) for module in list(sys.modules.values())]
    assert str(file.resolve()) not in loaded  # a failed load leaves no half-module behind


def test_python_missing_function_lists_what_the_file_defines(tmp_path):
    file = reward_file(
        tmp_path,
        """
        from os.path import join

        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            return 0.0

        def _helper():
            pass

        class Judge:
            pass
        """,
    )
    with pytest.raises(ConfigError) as info:
        python_reward(file)
    message = str(info.value)
    assert "reward.function=score" in message and str(file) in message
    assert "Judge, _helper, compute_score" in message
    assert "join" not in message.split("defines:")[1]  # imported, not defined there


def test_python_function_that_is_not_callable(tmp_path):
    file = reward_file(tmp_path, "score = 0.5")
    with pytest.raises(ConfigError, match=r"reward.function=score .* is a float, not a function"):
        python_reward(file)


def test_the_runner_scores_them_all_off_the_event_loop_thread(tmp_path, math_reward):
    from astraflow.rewards.base import RewardRunner

    file = reward_file(
        tmp_path,
        """
        async def score(task, completion):
            return {"score": 0.5, "chars": len(completion)}
        """,
    )

    async def run() -> list:
        rewards = [math_reward, python_reward(file), RegexReward(RegexConfig(pattern=r"(\d+)$"))]
        runners = [RewardRunner(reward, timeout=30.0) for reward in rewards]
        return [await runner.score(task("12"), r"1 + 11 = 12") for runner in runners]

    scores = asyncio.run(run())
    assert [(s.value, s.metrics, s.failed) for s in scores] == [
        (1.0, {"answer_found": 1.0}, False),
        (0.5, {"chars": 11.0}, False),
        (1.0, {}, False),
    ]
