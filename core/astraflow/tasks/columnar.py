"""Columnar task sources: ``task=parquet`` and ``verl`` (read with pyarrow, one record
batch at a time) and ``task=hf_dataset`` (Hugging Face ``datasets``: ``save_to_disk``
directories and ``load_dataset`` over files). Their libraries are imported on use:
``pip install 'astraflow[data]'``."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

from astraflow.errors import ConfigError
from astraflow.tasks.files import (
    BATCH_ROWS,
    DATA_EXTRA,
    FileTasks,
    HFDatasetTaskConfig,
    ParquetTaskConfig,
    PromptEncoder,
    Raw,
    Source,
    VerlTaskConfig,
    as_list,
    batch_rows,
    expand,
)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _need(module: str, option: str) -> Any:
    """An optional dependency, or a one-line error naming the extra that installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        package = module.split(".")[0]
        raise ConfigError(f"{option} needs {package}: {DATA_EXTRA}") from None


class ParquetTasks(FileTasks):
    """``task=parquet``: parquet files, decoded one record batch at a time."""

    config_cls = ParquetTaskConfig
    suffixes = (".parquet", ".pq")

    def _file(self, source: Source) -> Any:
        pq = _need("pyarrow.parquet", self._option())
        try:
            return pq.ParquetFile(source.paths[0])
        except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ...
            raise ConfigError(f"{source.label} is not a readable parquet file: "
                              f"{_first_line(exc)}") from None

    def _read(self, source: Source, keep: Callable[[int], bool] | None) -> Iterator[Raw]:
        handle = self._file(source)
        try:
            batches = handle.iter_batches(batch_size=BATCH_ROWS)
            for number, data in enumerate(batch_rows(batches, keep), 1):
                yield Raw(number, None, data)
        finally:
            handle.close()

    def _count(self, source: Source) -> int:
        handle = self._file(source)
        try:
            return int(handle.metadata.num_rows)
        finally:
            handle.close()


class VerlTasks(ParquetTasks):
    """``task=verl``: verl's parquet files, read with verl's keys."""

    config_cls = VerlTaskConfig


#: ``datasets.load_dataset`` builders by file suffix
_HF_FORMATS = {".jsonl": "json", ".json": "json", ".jsonl.gz": "json", ".parquet": "parquet",
               ".csv": "csv", ".arrow": "arrow", ".txt": "text"}


def _saved_dataset(path: str) -> bool:
    """Whether ``path`` is a directory written by ``save_to_disk``."""
    return os.path.isdir(path) and any(
        os.path.isfile(os.path.join(path, name))
        for name in ("dataset_dict.json", "state.json"))


def _hf_format(path: str) -> str | None:
    for suffix in sorted(_HF_FORMATS, key=len, reverse=True):
        if path.endswith(suffix):
            return _HF_FORMATS[suffix]
    return None


class HFDatasetTasks(FileTasks):
    """``task=hf_dataset``: each ``save_to_disk`` directory is one source (``split`` of a
    ``DatasetDict``); each other path or glob is one ``load_dataset`` over its files."""

    config_cls = HFDatasetTaskConfig
    suffixes = tuple(_HF_FORMATS)

    def __init__(self, config: Any = None, *, prompt_encoder: PromptEncoder | None = None
                 ) -> None:
        super().__init__(config, prompt_encoder=prompt_encoder)
        self._datasets: dict[Source, Any] = {}

    def _eval_origin(self) -> bool:
        return super()._eval_origin() or bool(self.config.eval_split)

    def _sources(self, origin: str) -> list[Source]:
        """Saved datasets (with the split to take) and file sets of one origin.

        Eval rows come from ``eval_files`` when given, else from ``eval_split`` of the
        training paths; a saved ``DatasetDict`` among ``eval_files`` gives ``eval_split``
        when set, else ``split``.
        """
        if origin not in self._sources_cache:
            cfg = self.config
            from_eval_files = origin == "eval" and bool(as_list(cfg.eval_files))
            own_files = origin == "train" or from_eval_files  # else: eval_split of train_files
            key = "eval_files" if from_eval_files else "train_files"
            split = cfg.split if origin == "train" else cfg.eval_split or cfg.split
            sources = []
            for pattern in as_list(getattr(cfg, key)):
                paths = expand([pattern], key, self.suffixes, dirs=_saved_dataset)
                sources += [Source(p if own_files else f"{p} [{split}]", (p,), split)
                            for p in paths if _saved_dataset(p)]
                files = [p for p in paths if not _saved_dataset(p)]
                if files and not own_files:
                    raise ConfigError(f"task.eval_split needs save_to_disk directories in "
                                      f"task.train_files; {pattern} holds data files")
                if files:
                    sources.append(Source(pattern if len(files) > 1 else files[0],
                                           tuple(files)))
            self._sources_cache[origin] = sources
        return self._sources_cache[origin]

    def _dataset(self, source: Source) -> Any:
        """The source as a ``datasets.Dataset`` (memory-mapped; loaded once)."""
        if source not in self._datasets:
            self._datasets[source] = self._load(source)
        return self._datasets[source]

    def _load(self, source: Source) -> Any:
        datasets = _need("datasets", self._option())
        if source.split is not None:
            try:
                loaded = datasets.load_from_disk(source.paths[0])
            except Exception as exc:
                raise ConfigError(f"{source.paths[0]} cannot be loaded with "
                                  f"datasets.load_from_disk: {_first_line(exc)}") from None
            return self._pick_split(loaded, source, datasets)
        formats = {_hf_format(p) for p in source.paths}
        if None in formats or len(formats) > 1:
            raise ConfigError(f"{source.label}: data files must share one format (by suffix: "
                              f"{', '.join(_HF_FORMATS)})")
        try:
            return datasets.load_dataset(formats.pop(), data_files=list(source.paths),
                                         split="train")
        except Exception as exc:
            raise ConfigError(f"{source.label} cannot be loaded with datasets.load_dataset: "
                              f"{_first_line(exc)}") from None

    @staticmethod
    def _pick_split(loaded: Any, source: Source, datasets: Any) -> Any:
        """The configured split of a saved ``DatasetDict`` (a saved ``Dataset`` is whole)."""
        if not isinstance(loaded, datasets.DatasetDict):
            return loaded
        if source.split not in loaded:
            raise ConfigError(f"{source.paths[0]} has no split '{source.split}' (splits: "
                              f"{', '.join(loaded)})")
        return loaded[source.split]

    def _read(self, source: Source, keep: Callable[[int], bool] | None) -> Iterator[Raw]:
        # arrow rows, not the dataset's Python format: images and audio stay undecoded
        table = self._dataset(source).with_format("arrow")
        batches = table.iter(batch_size=BATCH_ROWS)
        for number, data in enumerate(batch_rows(batches, keep), 1):
            yield Raw(number, None, data)

    def _count(self, source: Source) -> int:
        return len(self._dataset(source))

