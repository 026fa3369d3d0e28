"""Local dataset files as task sources: ``task=jsonl``, ``parquet``, ``hf_dataset``, ``verl``.

Rows are read lazily, file after file, so a source is cheap to construct and a large
file never has to fit in memory as Python objects. Each row becomes one :class:`Task`:
the prompt (text or chat messages) kept as written, the answer as text, and every field
of the row in ``metadata`` converted to JSON-safe values, because tasks cross processes
as JSON or msgpack.

Rows that :meth:`FileTasks.preflight` would reject (the first rows of each file) are
errors wherever they are read; a malformed row further down is skipped, logged and
counted in :meth:`FileTasks.stats` rather than stopping a long run at hour five.
"""

from __future__ import annotations

import copy
import glob
import gzip
import itertools
import json
import logging
import os
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, ClassVar, NamedTuple, Protocol

from astraflow.contracts import TaskSource
from astraflow.errors import ConfigError
from astraflow.schema import setting
from astraflow.tasks.rows import (
    RowError,
    answer_text,
    check_prompt,
    json_safe,
    resolve,
)
from astraflow.types import Task

log = logging.getLogger(__name__)

#: rows per file that ``preflight`` reads; a bad row among them is an error anywhere
PREFLIGHT_ROWS = 5
#: rows decoded to Python objects at a time from parquet and arrow files
BATCH_ROWS = 1024
#: invalid rows logged one by one before the rest are only counted
_MAX_WARNINGS = 20
_FITS, _TOO_LONG = 1, 2
DATA_EXTRA = "pip install 'astraflow[data]'"


# ---- configs -------------------------------------------------------------------------


@dataclass
class FileTaskConfig:
    """``task=jsonl``: one JSON object per line.

    Keys are dotted paths into nested fields (``reward_model.ground_truth``). Without
    ``eval_files``, ``eval_size`` rows (chosen with ``seed``) are held out of the
    training rows. ``max_prompt_tokens`` skips (never truncates) prompts that render to
    more tokens than that with ``tokenizer`` (a Hugging Face model directory; the
    launcher fills in the run's model path), ``apply_chat_template`` and
    ``system_prompt`` -- the way the rollout node renders them.
    """

    name: str = "jsonl"
    train_files: list[str] = field(default_factory=list)
    eval_files: list[str] = field(default_factory=list)
    eval_size: int = setting(0, ge=0)
    seed: int = setting(1234, ge=0)
    prompt_key: str = "prompt"
    answer_key: str | None = "answer"
    id_key: str | None = None  # default: <split>-<row index>
    task_type_key: str | None = None
    max_prompt_tokens: int | None = setting(None, ge=1, why="null: no limit")
    apply_chat_template: bool | None = None  # None: when the tokenizer has a chat template
    system_prompt: str | None = None
    tokenizer: str | None = None

    @staticmethod
    def relations(task: Any) -> list[str]:
        """Held-out rows come from one place."""
        if task.eval_size and as_list(task.eval_files):
            return ["task.eval_size and task.eval_files are both set: give one"]
        return []


@dataclass
class ParquetTaskConfig(FileTaskConfig):
    """``task=parquet``: parquet files (or directories of them), read in record batches."""

    name: str = "parquet"


@dataclass
class HFDatasetTaskConfig(FileTaskConfig):
    """``task=hf_dataset``: ``save_to_disk`` directories, or local data files (json, jsonl,
    parquet, csv, arrow, txt) loaded with ``datasets.load_dataset``. ``split`` picks the
    training split of a saved ``DatasetDict``; ``eval_split`` its held-out split."""

    name: str = "hf_dataset"
    split: str = "train"
    eval_split: str | None = None

    @staticmethod
    def relations(task: Any) -> list[str]:
        out = FileTaskConfig.relations(task)
        if task.eval_split and task.eval_size:
            out.append("task.eval_split and task.eval_size are both set: give one")
        return out


@dataclass
class VerlTaskConfig(ParquetTaskConfig):
    """``task=verl``: verl's parquet layout as it is (chat-message prompts, the answer in
    ``reward_model.ground_truth``, ``data_source`` as the task type)."""

    name: str = "verl"
    answer_key: str | None = "reward_model.ground_truth"
    task_type_key: str | None = "data_source"



# ---- reading -------------------------------------------------------------------------


class PromptEncoder(Protocol):
    """What counts a prompt's tokens (:class:`astraflow.text.TextTokenizer`)."""

    def encode_prompt(self, prompt: Any, *, chat_template: bool | None = None,
                      system_prompt: str | None = None) -> list[int]: ...


class Source(NamedTuple):
    """One unit a reader opens: a file, or for ``hf_dataset`` a saved dataset or file set."""

    label: str  # how messages name it
    paths: tuple[str, ...]
    split: str | None = None


class Raw(NamedTuple):
    """A row as read: 1-based row number in its source, the line for text files, and the
    decoded object (None for rows the caller asked to pass over undecoded)."""

    number: int
    line: int | None
    data: Any


def _located(source: Source, raw: Raw) -> str:
    where = f"{source.label} row {raw.number}"
    return where if raw.line in (None, raw.number) else f"{where} (line {raw.line})"


def as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def expand(patterns: Iterable[str], key: str, suffixes: tuple[str, ...],
           dirs: Callable[[str], bool] | None = None) -> list[str]:
    """Paths and globs as the files they name, in a stable order.

    A directory stands for the files with ``suffixes`` under it, unless ``dirs`` accepts
    it as a unit of its own. A path or glob that names nothing is an error.
    """
    found: list[str] = []
    for pattern in patterns:
        path = os.path.expanduser(pattern)
        if glob.has_magic(path):
            matches = sorted(glob.glob(path, recursive=True))
            matches = [m for m in matches if os.path.isfile(m) or (dirs and dirs(m))]
            if not matches:
                raise ConfigError(f"task.{key}: no file matches {pattern}")
            found += matches
        elif os.path.isdir(path) and not (dirs and dirs(path)):
            inside = sorted(os.path.join(root, name) for root, _, names in os.walk(path)
                            for name in names if name.endswith(suffixes))
            if not inside:
                raise ConfigError(f"task.{key}: {pattern} is a directory without "
                                  f"{' or '.join('*' + s for s in suffixes)} files")
            found += inside
        elif os.path.exists(path):
            found.append(path)
        else:
            raise ConfigError(f"task.{key}: {pattern} does not exist")
    return list(dict.fromkeys(found))


def batch_rows(batches: Iterable[Any], keep: Callable[[int], bool] | None) -> Iterator[Any]:
    """Rows of arrow record batches (or tables); only rows ``keep`` accepts are decoded."""
    start = 0
    for batch in batches:
        size = batch.num_rows
        wanted = range(size) if keep is None else [i for i in range(size) if keep(start + i)]
        if len(wanted) == size:
            yield from batch.to_pylist()
        else:
            decoded = dict(zip(wanted, batch.take(wanted).to_pylist() if wanted else [],
                               strict=True))
            for i in range(size):
                yield decoded.get(i)
        start += size


# ---- the task sources ----------------------------------------------------------------


class FileTasks(TaskSource):
    """Rows of local files as tasks (the reader is the subclass's): ids, eval split,
    prompt-length filter, checks and counts are shared."""

    config_cls: ClassVar[type[FileTaskConfig]] = FileTaskConfig
    #: files a directory stands for
    suffixes: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: Any = None, *, prompt_encoder: PromptEncoder | None = None
                 ) -> None:
        super().__init__(config if config is not None else self.config_cls())
        self._encoder = prompt_encoder
        self._check_config()
        self._sources_cache: dict[str, list[Source]] = {}
        self._held_cache: frozenset[int] | None = None
        self._eval_cache: list[Task] | None = None
        #: per file list: 0 unknown, _FITS or _TOO_LONG for each row index
        self._lengths: dict[str, bytearray] = {"train": bytearray(), "eval": bytearray()}
        #: rows of the training files any pass has reached; counts never double per epoch
        self._train_seen = 0
        self._counts = dict.fromkeys(
            ("rows", "train", "eval", "skipped_too_long", "skipped_invalid"), 0)
        self._warnings = 0

    # -- config ---------------------------------------------------------------------

    def _option(self) -> str:
        return f"task={self.config.name}"

    def _check_config(self) -> None:
        """Mistakes visible in the config alone, found before any file is opened."""
        cfg = self.config
        if not as_list(cfg.train_files):
            raise ConfigError(f"{self._option()} needs task.train_files (paths or globs)")
        if wrong := self.config_cls.relations(cfg):
            raise ConfigError(wrong[0])
        if not cfg.prompt_key:
            raise ConfigError("task.prompt_key is empty")

    def _eval_origin(self) -> bool:
        """Whether held-out rows come from their own files rather than the training rows."""
        return bool(as_list(self.config.eval_files))

    # -- reading, per format ----------------------------------------------------------

    def _sources(self, origin: str) -> list[Source]:
        """The sources of the training (``origin="train"``) or eval files, resolved once."""
        if origin not in self._sources_cache:
            key = f"{origin}_files"
            paths = expand(as_list(getattr(self.config, key)), key, self.suffixes)
            self._sources_cache[origin] = [Source(p, (p,)) for p in paths]
        return self._sources_cache[origin]

    def _read(self, source: Source, keep: Callable[[int], bool] | None) -> Iterator[Raw]:
        """Every row of ``source`` in order; rows ``keep`` rejects need not be decoded."""
        raise NotImplementedError

    def _count(self, source: Source) -> int:
        return sum(1 for _ in self._read(source, lambda _: False))

    # -- rows to tasks ------------------------------------------------------------------

    def _scan(self, origin: str, keep: Callable[[int], bool] | None = None
              ) -> Iterator[tuple[int, Source, Raw]]:
        """Rows of every source of ``origin`` with their index across the sources."""
        index = 0
        for source in self._sources(origin):
            local = None if keep is None else (lambda pos, off=index: keep(off + pos))
            for raw in self._read(source, local):
                yield index, source, raw
                index += 1

    def _parse(self, data: Any) -> tuple[dict[str, Any], Any, str | None, str | None, str]:
        """The row as JSON-safe fields, its prompt, answer, own id and task type."""
        cfg = self.config
        row = json_safe(data)
        prompt = resolve(row, cfg.prompt_key)
        check_prompt(prompt, cfg.prompt_key)
        answer = answer_text(resolve(row, cfg.answer_key)) if cfg.answer_key else None
        task_id = None
        if cfg.id_key:
            value = resolve(row, cfg.id_key)
            if value is None or value == "":
                raise RowError(f"the id '{cfg.id_key}' is empty")
            task_id = answer_text(value)
        task_type = "default"
        if cfg.task_type_key:
            value = resolve(row, cfg.task_type_key)
            task_type = "default" if value is None else str(answer_text(value))
        return row, prompt, answer, task_id, task_type

    def _task(self, origin: str, split: str, index: int, source: Source, raw: Raw,
              fresh: bool) -> Task | str:
        """The row's task, or why it is skipped (``"invalid"``, ``"too_long"``)."""
        try:
            row, prompt, answer, task_id, task_type = self._parse(raw.data)
        except RowError as exc:
            where = _located(source, raw)
            if raw.number <= PREFLIGHT_ROWS:
                raise ConfigError(f"{where}: {exc}") from None
            if fresh:
                self._warn(f"{where}: {exc}; row skipped")
            return "invalid"
        if not self._fits(origin, index, prompt, source, raw):
            return "too_long"
        # its own copy (json_safe rebuilds containers): a workflow may extend the prompt
        return Task(task_id=task_id or f"{split}-{index}", prompt=json_safe(prompt),
                    answer=answer, task_type=task_type, metadata=row)

    def _warn(self, message: str) -> None:
        self._warnings += 1
        if self._warnings <= _MAX_WARNINGS:
            log.warning("%s", message)
        if self._warnings == _MAX_WARNINGS:
            log.warning("further invalid rows are only counted (skipped_invalid)")

    # -- prompt length ------------------------------------------------------------------

    def encoder(self) -> PromptEncoder:
        """What prompts are measured with: the one given, else ``task.tokenizer``'s."""
        if self._encoder is None:
            path = self.config.tokenizer
            if not path:
                raise ConfigError("task.max_prompt_tokens needs task.tokenizer (a Hugging "
                                  "Face model directory; the run's model.path when unset)")
            from astraflow.text import load_tokenizer

            self._encoder = load_tokenizer(path)
        return self._encoder

    def prompt_tokens(self, prompt: Any) -> int:
        """Tokens of ``prompt`` as the node renders it (chat template, system prompt)."""
        cfg = self.config
        return len(self.encoder().encode_prompt(
            prompt, chat_template=cfg.apply_chat_template, system_prompt=cfg.system_prompt))

    def _fits(self, origin: str, index: int, prompt: Any, source: Source, raw: Raw) -> bool:
        """Whether the prompt is within ``max_prompt_tokens``; each row is measured once
        per source object, not once per epoch."""
        limit = self.config.max_prompt_tokens
        if limit is None:
            return True
        marks = self._lengths[origin]
        if index < len(marks) and marks[index]:
            return marks[index] == _FITS
        try:
            fits = self.prompt_tokens(prompt) <= limit
        except ValueError as exc:
            raise ConfigError(f"{_located(source, raw)}: {exc}") from None
        if index >= len(marks):
            marks.extend(bytes(index + 1 - len(marks)))
        marks[index] = _FITS if fits else _TOO_LONG
        return fits

    # -- splits -----------------------------------------------------------------------

    def rows(self, origin: str = "train") -> int:
        """Rows in the training (or eval) files, skipped ones included."""
        return sum(self._count(source) for source in self._sources(origin))

    def _held_out(self) -> frozenset[int]:
        """Indices of the training rows that form the eval split (``eval_size``)."""
        if self._held_cache is None:
            size = self.config.eval_size
            if self._eval_origin() or not size:
                self._held_cache = frozenset()
            else:
                total = self.rows("train")
                if size >= total:
                    raise ConfigError(f"task.eval_size={size} but the training files have "
                                      f"{total} rows: nothing would be left to train on")
                rng = random.Random(self.config.seed)
                self._held_cache = frozenset(rng.sample(range(total), size))
        return self._held_cache

    def train_tasks(self) -> Iterator[Task]:
        """One pass over the training rows in file order (the held-out rows left out);
        every pass yields the same tasks in the same order."""
        held = self._held_out()
        keep = (lambda i: i not in held) if held else None
        for index, source, raw in self._scan("train", keep):
            fresh = index >= self._train_seen
            if fresh:
                self._train_seen = index + 1
                self._counts["rows"] += 1
            if raw.data is None:
                continue
            task = self._task("train", "train", index, source, raw, fresh)
            if isinstance(task, Task):
                self._counts["train"] += fresh
                yield task
            elif fresh:
                self._counts[f"skipped_{task}"] += 1

    def eval_tasks(self) -> list[Task]:
        """The held-out tasks (read once), as copies the caller may change."""
        if self._eval_cache is None:
            self._eval_cache = self._read_eval()
        return copy.deepcopy(self._eval_cache)

    def _read_eval(self) -> list[Task]:
        if self._eval_origin():
            origin, keep, rows = "eval", None, True
        else:
            held = self._held_out()
            if not held:
                return []
            origin, keep, rows = "train", held.__contains__, False
        tasks: list[Task] = []
        for index, source, raw in self._scan(origin, keep):
            self._counts["rows"] += rows
            if raw.data is None:
                continue
            task = self._task(origin, "eval", index, source, raw, True)
            if isinstance(task, Task):
                tasks.append(task)
            else:
                self._counts[f"skipped_{task}"] += 1
        self._counts["eval"] = len(tasks)
        return tasks

    def stats(self) -> dict[str, int]:
        """Rows read, tasks made per split and rows skipped, so far (never per epoch)."""
        return dict(self._counts)

    # -- checks -----------------------------------------------------------------------

    def preflight(self) -> None:
        """Open every file, check the first rows' keys and prompts (and measure them when
        ``max_prompt_tokens`` is set) and the eval split's size."""
        origins = ["train", "eval"] if self._eval_origin() else ["train"]
        for origin in origins:
            found = 0
            for source in self._sources(origin):
                for raw in itertools.islice(self._read(source, None), PREFLIGHT_ROWS):
                    found += 1
                    self._preflight_row(source, raw)
            if not found:
                what = "task.train_files" if origin == "train" else "the eval split"
                files = ", ".join(s.label for s in self._sources(origin))
                raise ConfigError(f"{what}: no rows in {files}")
        self._held_out()

    def _preflight_row(self, source: Source, raw: Raw) -> None:
        try:
            _, prompt, *_ = self._parse(raw.data)
        except RowError as exc:
            raise ConfigError(f"{_located(source, raw)}: {exc}") from None
        if self.config.max_prompt_tokens is not None:
            try:
                self.prompt_tokens(prompt)
            except ValueError as exc:
                raise ConfigError(f"{_located(source, raw)}: {exc}") from None


class JsonlTasks(FileTasks):
    """``task=jsonl``: one JSON object per line (``.gz`` files are read compressed);
    blank lines are skipped, a line that is not a JSON object is an error."""

    config_cls = FileTaskConfig
    suffixes = (".jsonl", ".jsonl.gz", ".ndjson")

    @staticmethod
    def _open(path: str) -> IO[str]:
        if path.endswith(".gz"):
            return gzip.open(path, "rt", encoding="utf-8-sig")
        return open(path, encoding="utf-8-sig")

    def _read(self, source: Source, keep: Callable[[int], bool] | None) -> Iterator[Raw]:
        path = source.paths[0]
        number = 0
        try:
            with self._open(path) as handle:
                for line_no, line in enumerate(handle, 1):
                    if not line.strip():
                        continue
                    number += 1
                    if keep is not None and not keep(number - 1):
                        yield Raw(number, line_no, None)
                        continue
                    yield Raw(number, line_no, self._decode(line, source.label, line_no))
        except (UnicodeDecodeError, OSError) as exc:
            raise ConfigError(f"{source.label} cannot be read as UTF-8 JSON lines: "
                              f"{exc}") from None

    @staticmethod
    def _decode(line: str, label: str, line_no: int) -> dict[str, Any]:
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            hint = ("; a JSON array is not JSON lines (task=hf_dataset reads .json arrays)"
                    if line_no == 1 and line.lstrip().startswith("[") else "")
            raise ConfigError(f"{label} line {line_no}: not valid JSON ({exc.msg} at "
                              f"column {exc.colno}){hint}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{label} line {line_no}: expected a JSON object, got "
                              f"{type(data).__name__}")
        return data
