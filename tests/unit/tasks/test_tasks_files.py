"""Local dataset files as task sources: what a user pointing AstraFlow at their data sees."""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

import msgpack
import pytest
from omegaconf import OmegaConf

from astraflow.errors import ConfigError
from astraflow.tasks.columnar import HFDatasetTasks, ParquetTasks, VerlTasks
from astraflow.tasks.files import (
    FileTaskConfig,
    HFDatasetTaskConfig,
    JsonlTasks,
    ParquetTaskConfig,
    VerlTaskConfig,
)

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def write_jsonl(path: Path, rows: list[Any], blank_after: int | None = None) -> str:
    lines = [json.dumps(r) if not isinstance(r, str) else r for r in rows]
    if blank_after is not None:
        lines.insert(blank_after, "")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def qa_rows(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"prompt": f"{i}+1=", "answer": i + 1, "level": i % 3} for i in range(start, start + n)]


def jsonl_source(tmp_path: Path, rows: list[Any] | None = None, **cfg: Any) -> JsonlTasks:
    path = write_jsonl(tmp_path / "train.jsonl", rows if rows is not None else qa_rows(10))
    return JsonlTasks(FileTaskConfig(train_files=[path], **cfg))


def verl_rows(n: int) -> list[dict[str, Any]]:
    return [
        {
            "data_source": "openai/gsm8k" if i % 2 else "math",
            "prompt": [{"role": "user", "content": f"What is {i} times 2?"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"split": "train", "index": i, "answer": f"{i}*2={2 * i}"},
        }
        for i in range(n)
    ]


class FakeEncoder:
    """One token per word of the rendered text; remembers what it was asked."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, Any, Any]] = []

    def encode_prompt(self, prompt: Any, *, chat_template: bool | None = None,
                      system_prompt: str | None = None) -> list[int]:
        self.calls.append((prompt, chat_template, system_prompt))
        text = prompt if isinstance(prompt, str) else " ".join(m["content"] for m in prompt)
        return list(range(len(((system_prompt or "") + " " + text).split())))


def error_of(fn: Any) -> str:
    with pytest.raises(ConfigError) as info:
        fn()
    message = str(info.value)
    assert "\n" not in message
    return message


# ---- jsonl ---------------------------------------------------------------------------


def test_jsonl_rows_become_tasks_with_text_answers_and_every_field(tmp_path):
    source = jsonl_source(tmp_path)
    tasks = list(source.train_tasks())
    assert [t.task_id for t in tasks] == [f"train-{i}" for i in range(10)]
    first = tasks[3]
    assert (first.prompt, first.answer, first.task_type) == ("3+1=", "4", "default")
    assert first.metadata == {"prompt": "3+1=", "answer": 4, "level": 0}
    assert source.eval_tasks() == []
    assert source.stats() == {"rows": 10, "train": 10, "eval": 0, "skipped_too_long": 0,
                              "skipped_invalid": 0}


def test_every_pass_yields_the_same_tasks_and_counts_are_not_doubled(tmp_path):
    source = jsonl_source(tmp_path, eval_size=3)
    first = list(source.train_tasks())
    second = list(source.train_tasks())
    assert first == second and len(first) == 7
    partial = source.train_tasks()
    assert next(partial) == first[0]
    assert source.stats()["train"] == 7 and source.stats()["rows"] == 10


def test_id_and_task_type_keys_and_answerless_tasks(tmp_path):
    rows = [{"uid": f"q{i}", "q": f"say {i}", "kind": ["a", "b"][i % 2]} for i in range(4)]
    source = jsonl_source(tmp_path, rows, prompt_key="q", answer_key=None, id_key="uid",
                          task_type_key="kind")
    tasks = list(source.train_tasks())
    assert [(t.task_id, t.task_type, t.answer) for t in tasks] == [
        ("q0", "a", None), ("q1", "b", None), ("q2", "a", None), ("q3", "b", None)]


def test_blank_lines_are_skipped_and_answers_of_any_json_type_become_text(tmp_path):
    rows = [{"prompt": "a", "answer": 2.5}, {"prompt": "b", "answer": True},
            {"prompt": "c", "answer": ["x", "y"]}, {"prompt": "d", "answer": None}]
    path = write_jsonl(tmp_path / "t.jsonl", rows, blank_after=1)
    tasks = list(JsonlTasks(FileTaskConfig(train_files=[path])).train_tasks())
    assert [t.answer for t in tasks] == ["2.5", "true", '["x", "y"]', None]
    assert [t.task_id for t in tasks] == ["train-0", "train-1", "train-2", "train-3"]


# ---- eval split ----------------------------------------------------------------------


def test_eval_size_holds_out_seeded_rows_disjoint_from_training(tmp_path):
    source = jsonl_source(tmp_path, rows=qa_rows(50), eval_size=10, seed=7)
    train, held = list(source.train_tasks()), source.eval_tasks()
    assert len(train) == 40 and len(held) == 10
    train_prompts, eval_prompts = {t.prompt for t in train}, {t.prompt for t in held}
    assert not train_prompts & eval_prompts
    assert len(train_prompts | eval_prompts) == 50
    assert all(t.task_id.startswith("eval-") for t in held)
    assert not {t.task_id for t in train} & {t.task_id for t in held}
    again = jsonl_source(tmp_path / "again", rows=qa_rows(50), eval_size=10, seed=7)
    assert [t.prompt for t in again.eval_tasks()] == [t.prompt for t in held]
    other = jsonl_source(tmp_path / "other", rows=qa_rows(50), eval_size=10, seed=8)
    assert {t.prompt for t in other.eval_tasks()} != eval_prompts
    assert source.stats()["eval"] == 10


def test_eval_files_give_the_held_out_split(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", qa_rows(5))
    test = write_jsonl(tmp_path / "test.jsonl", qa_rows(3, start=100))
    source = JsonlTasks(FileTaskConfig(train_files=[train], eval_files=[test]))
    held = source.eval_tasks()
    assert [(t.task_id, t.prompt) for t in held] == [
        ("eval-0", "100+1="), ("eval-1", "101+1="), ("eval-2", "102+1=")]
    assert len(list(source.train_tasks())) == 5
    held[0].metadata["answer"] = "changed"
    assert source.eval_tasks()[0].metadata["answer"] == 101


def test_eval_size_larger_than_the_data_and_both_eval_settings_are_errors(tmp_path):
    source = jsonl_source(tmp_path, rows=qa_rows(4), eval_size=4)
    assert "task.eval_size=4 but the training files have 4 rows" in error_of(source.preflight)
    path = write_jsonl(tmp_path / "x.jsonl", qa_rows(4))
    message = error_of(lambda: JsonlTasks(FileTaskConfig(train_files=[path], eval_files=[path],
                                                         eval_size=2)))
    assert message == "task.eval_size and task.eval_files are both set: give one"
    assert "needs task.train_files" in error_of(lambda: JsonlTasks(FileTaskConfig()))


# ---- globs, directories, dotted keys -------------------------------------------------


def test_globs_and_directories_read_files_in_sorted_order(tmp_path):
    write_jsonl(tmp_path / "data" / "part-1.jsonl", qa_rows(2, start=10))
    write_jsonl(tmp_path / "data" / "part-0.jsonl", qa_rows(2, start=0))
    (tmp_path / "data" / "notes.txt").write_text("not data")
    for files in ([str(tmp_path / "data" / "part-*.jsonl")], [str(tmp_path / "data")]):
        tasks = list(JsonlTasks(FileTaskConfig(train_files=files)).train_tasks())
        assert [(t.task_id, t.prompt) for t in tasks] == [
            ("train-0", "0+1="), ("train-1", "1+1="), ("train-2", "10+1="), ("train-3", "11+1=")]


def test_a_glob_or_path_that_names_nothing_is_an_error_naming_it(tmp_path):
    pattern = str(tmp_path / "nothing-*.jsonl")
    source = JsonlTasks(FileTaskConfig(train_files=[pattern]))
    assert error_of(source.preflight) == f"task.train_files: no file matches {pattern}"
    missing = str(tmp_path / "data" / "train.jsonl")
    source = JsonlTasks(FileTaskConfig(train_files=[missing]))  # constructing reads nothing
    assert error_of(source.preflight) == f"task.train_files: {missing} does not exist"
    assert error_of(lambda: list(source.train_tasks())) == (
        f"task.train_files: {missing} does not exist")
    test = JsonlTasks(FileTaskConfig(train_files=[write_jsonl(tmp_path / "t.jsonl", qa_rows(1))],
                                     eval_files=[missing]))
    assert error_of(test.preflight) == f"task.eval_files: {missing} does not exist"


def test_dotted_keys_reach_nested_fields_and_list_items(tmp_path):
    rows = [{"q": {"text": f"q{i}"}, "meta": {"sol": [{"v": i}], "src": "s"}} for i in range(3)]
    source = jsonl_source(tmp_path, rows, prompt_key="q.text", answer_key="meta.sol.0.v",
                          task_type_key="meta.src")
    tasks = list(source.train_tasks())
    assert [(t.prompt, t.answer, t.task_type) for t in tasks] == [
        ("q0", "0", "s"), ("q1", "1", "s"), ("q2", "2", "s")]


# ---- bad input -----------------------------------------------------------------------


def test_a_bad_json_line_names_the_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", [*qa_rows(2), '{"prompt": "x", "answer": '],
                       blank_after=1)
    source = JsonlTasks(FileTaskConfig(train_files=[path]))
    message = error_of(lambda: list(source.train_tasks()))
    assert message.startswith(f"{path} line 4: not valid JSON")
    assert error_of(source.preflight).startswith(f"{path} line 4: not valid JSON")
    path = write_jsonl(tmp_path / "list.jsonl", ["[1, 2]"])
    assert error_of(JsonlTasks(FileTaskConfig(train_files=[path])).preflight) == (
        f"{path} line 1: expected a JSON object, got list")


def test_a_row_without_the_prompt_key_names_file_row_key_and_row_keys(tmp_path):
    source = jsonl_source(tmp_path, prompt_key="question")
    path = tmp_path / "train.jsonl"
    assert error_of(source.preflight) == (
        f"{path} row 1: no key 'question' (row keys: prompt, answer, level)")
    assert error_of(lambda: list(source.train_tasks())) == error_of(source.preflight)


def test_a_missing_dotted_part_says_which_part(tmp_path):
    rows = [{"prompt": "p", "reward_model": {"style": "rule", "truth": "1"}}]
    source = jsonl_source(tmp_path, rows, answer_key="reward_model.ground_truth")
    assert error_of(source.preflight) == (
        f"{tmp_path / 'train.jsonl'} row 1: no key 'reward_model.ground_truth': "
        "'reward_model' has no 'ground_truth' (its keys: style, truth)")
    rows = [{"prompt": "p", "reward_model": "1"}]
    source = jsonl_source(tmp_path / "s", rows, answer_key="reward_model.ground_truth")
    assert error_of(source.preflight).endswith(
        "row 1: no key 'reward_model.ground_truth': 'reward_model' is str, not a mapping")
    rows = [{"prompt": "p", "answer": "1"}]
    source = jsonl_source(tmp_path / "t", rows, answer_key="reward_model.ground_truth")
    assert error_of(source.preflight).endswith(
        "row 1: no key 'reward_model.ground_truth': the row has no 'reward_model' "
        "(row keys: prompt, answer)")


@pytest.mark.parametrize(("prompt", "expected"), [
    ("", "the prompt 'prompt' is empty"),
    ("   ", "the prompt 'prompt' is empty"),
    (None, "the prompt 'prompt' is empty"),
    ([], "the prompt 'prompt' is empty"),
    (7, "the prompt 'prompt' must be text or a list of chat messages, not int"),
    ([{"role": "user"}], "the prompt 'prompt': message 1 has no 'content' (message keys: role)"),
    (["hi"], "the prompt 'prompt': message 1 is str, not a mapping with role and content"),
])
def test_empty_or_malformed_prompts_are_errors(tmp_path, prompt, expected):
    source = jsonl_source(tmp_path, [{"prompt": "fine", "answer": 1},
                                     {"prompt": prompt, "answer": 2}])
    assert error_of(source.preflight) == f"{tmp_path / 'train.jsonl'} row 2: {expected}"


def test_bad_rows_past_the_checked_ones_are_skipped_and_counted(tmp_path, caplog):
    rows = [*qa_rows(6), {"prompt": "", "answer": 1}, {"answer": 2}, *qa_rows(2, start=6)]
    source = jsonl_source(tmp_path, rows)
    source.preflight()
    tasks = list(source.train_tasks())
    assert [t.task_id for t in tasks] == [f"train-{i}" for i in (0, 1, 2, 3, 4, 5, 8, 9)]
    list(source.train_tasks())
    assert source.stats()["skipped_invalid"] == 2 and source.stats()["train"] == 8
    assert f"{tmp_path / 'train.jsonl'} row 7: the prompt 'prompt' is empty" in caplog.text


def test_a_missing_extra_names_the_pip_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    source = ParquetTasks(ParquetTaskConfig(train_files=[str(tmp_path / "x.parquet")]))
    (tmp_path / "x.parquet").write_bytes(b"")
    assert error_of(source.preflight) == (
        "task=parquet needs pyarrow: pip install 'astraflow[data]'")
    monkeypatch.setitem(sys.modules, "datasets", None)
    source = HFDatasetTasks(HFDatasetTaskConfig(train_files=[str(tmp_path / "x.parquet")]))
    assert error_of(source.preflight) == (
        "task=hf_dataset needs datasets: pip install 'astraflow[data]'")


# ---- prompt length -------------------------------------------------------------------


def jsonl_source_kw(tmp_path: Path, rows: list[Any], encoder: Any, **cfg: Any) -> JsonlTasks:
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    return JsonlTasks(FileTaskConfig(train_files=[path], **cfg), prompt_encoder=encoder)


def test_max_prompt_tokens_skips_and_counts_long_prompts_measured_once(tmp_path):
    rows = [{"prompt": " ".join(["w"] * n), "answer": n} for n in (1, 5, 2, 9, 3)]
    encoder = FakeEncoder()
    source = jsonl_source_kw(tmp_path, rows, encoder, max_prompt_tokens=4,
                             system_prompt="Be brief.", apply_chat_template=False)
    kept = [t.answer for t in source.train_tasks()]
    assert kept == ["1", "2"]  # 'Be brief.' adds two words: 3+2 words and more are too long
    assert [t.prompt for t in source.train_tasks()] == ["w", "w w"]  # never truncated
    assert len(encoder.calls) == 5  # measured once, not once per epoch
    assert encoder.calls[0] == ("w", False, "Be brief.")
    assert source.stats()["skipped_too_long"] == 3 and source.stats()["train"] == 2


def test_max_prompt_tokens_applies_to_the_eval_split_too(tmp_path):
    rows = [{"prompt": " ".join(["w"] * (1 + i % 4)), "answer": i} for i in range(20)]
    source = jsonl_source_kw(tmp_path, rows, FakeEncoder(), max_prompt_tokens=2, eval_size=8)
    train, held = list(source.train_tasks()), source.eval_tasks()
    assert len(train) + len(held) == 10  # every row of 1 or 2 words, no other
    assert source.stats()["skipped_too_long"] == 10


def test_max_prompt_tokens_without_a_tokenizer_is_an_error(tmp_path):
    source = jsonl_source(tmp_path, max_prompt_tokens=10)
    assert "task.max_prompt_tokens needs task.tokenizer" in error_of(source.preflight)


def write_tokenizer(model_dir: Path) -> str:
    """A word-level tokenizer with a chat template, as a checkpoint directory holds it."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<unk>", "</s>", "user", ":", "assistant", "what", "is", "two", "plus", "one",
             "three"]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    model_dir.mkdir(parents=True)
    core.save(str(model_dir / "tokenizer.json"))
    template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} {% endfor %}"
                "{% if add_generation_prompt %}assistant: {% endif %}")
    (model_dir / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "</s>", "chat_template": template}))
    return str(model_dir)


def test_max_prompt_tokens_counts_with_the_checkpoints_tokenizer(tmp_path):
    pytest.importorskip("jinja2")
    model = write_tokenizer(tmp_path / "model")
    rows = [{"prompt": [{"role": "user", "content": "what is two plus one"}], "answer": 3},
            {"prompt": "what is three", "answer": 3}]
    # rendered with the chat template: "user : what is two plus one assistant :" is 9
    # tokens, "user : what is three assistant :" is 7
    source = jsonl_source(tmp_path, rows, max_prompt_tokens=8, tokenizer=model)
    source.preflight()
    assert [t.answer for t in source.train_tasks()] == ["3"]
    assert [t.prompt for t in source.train_tasks()] == ["what is three"]
    assert source.stats()["skipped_too_long"] == 1


# ---- parquet and verl ----------------------------------------------------------------


def test_parquet_values_become_json_safe_metadata(tmp_path):
    table = pa.table({
        "prompt": ["a", "b", "c"],
        "answer": pa.array([1, 2, 3], pa.int64()),
        "score": [0.5, float("nan"), 1.5],
        "tags": [["x"], [], ["y", "z"]],
        "when": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5)] * 3, pa.timestamp("us")),
        "blob": [b"\x89PNG\x00\xff", b"text", None],
        "nested": [{"k": 1}, {"k": 2}, {"k": None}],
    })
    path = tmp_path / "train.parquet"
    pq.write_table(table, path, row_group_size=2)
    source = ParquetTasks(ParquetTaskConfig(train_files=[str(path)]))
    source.preflight()
    tasks = list(source.train_tasks())
    assert [(t.prompt, t.answer) for t in tasks] == [("a", "1"), ("b", "2"), ("c", "3")]
    assert tasks[0].metadata == {"prompt": "a", "answer": 1, "score": 0.5, "tags": ["x"],
                                 "when": "2024-01-02T03:04:05", "nested": {"k": 1}}
    assert tasks[1].metadata["score"] is None and tasks[1].metadata["blob"] == "text"
    for task in tasks:
        json.dumps(task.metadata, allow_nan=False)
        assert msgpack.unpackb(msgpack.packb(task.metadata)) == task.metadata


def test_parquet_eval_size_reads_only_what_it_needs_and_matches_training_disjointly(tmp_path):
    rows = qa_rows(3000)
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=700)
    source = ParquetTasks(ParquetTaskConfig(train_files=[str(path)], eval_size=25, seed=3))
    train, held = list(source.train_tasks()), source.eval_tasks()
    assert len(train) == 2975 and len(held) == 25
    assert sorted([t.prompt for t in train] + [t.prompt for t in held]) == sorted(
        r["prompt"] for r in rows)
    assert [t.task_id for t in held] == sorted((t.task_id for t in held),
                                               key=lambda i: int(i.split("-")[1]))
    assert source.stats()["rows"] == 3000


def test_a_file_that_is_not_parquet_is_named(tmp_path):
    path = tmp_path / "train.parquet"
    path.write_text("prompt,answer\n1,2\n")
    message = error_of(ParquetTasks(ParquetTaskConfig(train_files=[str(path)])).preflight)
    assert message.startswith(f"{path} is not a readable parquet file")


def test_verl_parquet_is_read_as_it_is(tmp_path):
    rows = verl_rows(6)
    path = tmp_path / "gsm8k" / "train.parquet"
    path.parent.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), path)
    source = VerlTasks(VerlTaskConfig(train_files=[str(tmp_path / "gsm8k" / "*.parquet")]))
    source.preflight()
    tasks = list(source.train_tasks())
    assert tasks[3].prompt == [{"role": "user", "content": "What is 3 times 2?"}]
    assert (tasks[3].answer, tasks[3].task_type) == ("6", "openai/gsm8k")
    assert tasks[3].metadata == rows[3]
    assert tasks[0].task_type == "math"
    assert VerlTaskConfig().name == "verl" and isinstance(VerlTasks(VerlTaskConfig(
        train_files=["x"])), ParquetTasks)


def test_configs_are_hydra_structured_configs(tmp_path):
    rows = verl_rows(2)
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    conf = OmegaConf.merge(OmegaConf.structured(VerlTaskConfig),
                           {"train_files": [str(path)], "max_prompt_tokens": None})
    for config in (conf, OmegaConf.to_object(conf)):  # a DictConfig works as it is too
        tasks = list(VerlTasks(config).train_tasks())
        assert [t.answer for t in tasks] == ["0", "2"]
    with pytest.raises(Exception, match="question"):
        OmegaConf.merge(OmegaConf.structured(FileTaskConfig), {"question": "x"})
    assert OmegaConf.structured(HFDatasetTaskConfig).eval_split is None


# ---- hf_dataset ----------------------------------------------------------------------


@pytest.fixture
def datasets(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    datasets.disable_progress_bars()
    return datasets


def test_a_saved_dataset_becomes_tasks(tmp_path, datasets):
    rows = verl_rows(8)
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    cfg = HFDatasetTaskConfig(train_files=[str(tmp_path / "saved")], eval_size=2,
                              answer_key="reward_model.ground_truth", task_type_key="data_source")
    source = HFDatasetTasks(cfg)
    source.preflight()
    train, held = list(source.train_tasks()), source.eval_tasks()
    assert len(train) == 6 and len(held) == 2
    by_index = {int(t.task_id.split("-")[1]): t for t in train + held}
    assert sorted(by_index) == list(range(8))
    assert by_index[5].prompt == rows[5]["prompt"] and by_index[5].answer == "10"
    assert by_index[5].metadata == rows[5]
    assert list(source.train_tasks()) == train


def test_a_saved_dataset_dict_gives_split_and_eval_split(tmp_path, datasets):
    saved = tmp_path / "dd"
    datasets.DatasetDict({
        "train": datasets.Dataset.from_list(qa_rows(5)),
        "test": datasets.Dataset.from_list(qa_rows(2, start=50)),
    }).save_to_disk(str(saved))
    source = HFDatasetTasks(HFDatasetTaskConfig(train_files=[str(saved)], eval_split="test"))
    source.preflight()
    assert [t.prompt for t in source.train_tasks()] == [f"{i}+1=" for i in range(5)]
    assert [(t.task_id, t.prompt) for t in source.eval_tasks()] == [
        ("eval-0", "50+1="), ("eval-1", "51+1=")]
    wrong = HFDatasetTasks(HFDatasetTaskConfig(train_files=[str(saved)], split="validation"))
    assert error_of(wrong.preflight) == f"{saved} has no split 'validation' (splits: train, test)"
    bad_key = HFDatasetTasks(HFDatasetTaskConfig(train_files=[str(saved)], prompt_key="q"))
    assert error_of(bad_key.preflight) == (
        f"{saved} row 1: no key 'q' (row keys: prompt, answer, level)")


def test_hf_dataset_loads_a_glob_of_data_files(tmp_path, datasets):
    write_jsonl(tmp_path / "data" / "a.jsonl", qa_rows(2))
    write_jsonl(tmp_path / "data" / "b.jsonl", qa_rows(2, start=2))
    pattern = str(tmp_path / "data" / "*.jsonl")
    source = HFDatasetTasks(HFDatasetTaskConfig(train_files=[pattern]))
    source.preflight()
    assert [t.prompt for t in source.train_tasks()] == ["0+1=", "1+1=", "2+1=", "3+1="]
    plain = HFDatasetTasks(HFDatasetTaskConfig(train_files=[pattern], eval_split="test"))
    assert "task.eval_split needs save_to_disk directories" in error_of(plain.preflight)


def test_answers_read_the_same_whatever_the_reader(tmp_path, datasets):
    rows = [{"prompt": "p", "answer": 0.1 + 0.2}, {"prompt": "q", "answer": 12.5}]
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "t.parquet")
    sources = [
        JsonlTasks(FileTaskConfig(train_files=[path])),
        ParquetTasks(ParquetTaskConfig(train_files=[str(tmp_path / "t.parquet")])),
        HFDatasetTasks(HFDatasetTaskConfig(train_files=[path])),
    ]
    for source in sources:
        assert [t.answer for t in source.train_tasks()] == ["0.30000000000000004", "12.5"]


def test_hf_dataset_eval_files_and_conflicting_eval_settings(tmp_path, datasets):
    datasets.Dataset.from_list(qa_rows(4)).save_to_disk(str(tmp_path / "train"))
    datasets.Dataset.from_list(qa_rows(2, start=9)).save_to_disk(str(tmp_path / "test"))
    source = HFDatasetTasks(HFDatasetTaskConfig(train_files=[str(tmp_path / "train")],
                                                eval_files=[str(tmp_path / "test")]))
    source.preflight()
    assert [t.prompt for t in source.eval_tasks()] == ["9+1=", "10+1="]
    assert error_of(lambda: HFDatasetTasks(HFDatasetTaskConfig(
        train_files=[str(tmp_path / "train")], eval_split="test", eval_size=1))) == (
        "task.eval_split and task.eval_size are both set: give one")


# ---- more of what a user runs into ---------------------------------------------------


def test_a_json_array_file_given_as_jsonl_says_so(tmp_path):
    path = tmp_path / "train.json"
    path.write_text(json.dumps(qa_rows(2), indent=1))
    message = error_of(JsonlTasks(FileTaskConfig(train_files=[str(path)])).preflight)
    assert message.startswith(f"{path} line 1: not valid JSON")
    assert "a JSON array is not JSON lines" in message


def test_chat_prompts_with_a_tokenizer_without_a_chat_template_name_the_row(tmp_path):
    model = Path(write_tokenizer(tmp_path / "model"))
    (model / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    rows = [{"prompt": [{"role": "user", "content": "what is two"}], "answer": 2}]
    source = jsonl_source(tmp_path, rows, max_prompt_tokens=50, tokenizer=str(model))
    message = error_of(source.preflight)
    assert message.startswith(f"{tmp_path / 'train.jsonl'} row 1: the prompt is a list of chat")


def test_prompts_are_the_tasks_own_copies(tmp_path):
    rows = [{"prompt": [{"role": "user", "content": "hi"}], "answer": 1}]
    source = jsonl_source(tmp_path, rows, eval_files=[write_jsonl(tmp_path / "e.jsonl", rows)])
    task = next(source.train_tasks())
    task.prompt.append({"role": "assistant", "content": "hello"})
    assert task.metadata["prompt"] == [{"role": "user", "content": "hi"}]
    source.eval_tasks()[0].prompt.clear()
    assert source.eval_tasks()[0].prompt == [{"role": "user", "content": "hi"}]


