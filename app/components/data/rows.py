"""Rows through the `datasets` library, for every task that reads them (`data.source=datasets`).

Where rows come from: JSONL/JSON, CSV/TSV or Parquet files (`data.paths`, and `data.val_paths` for
a validation set of their own), a directory written by `save_to_disk`, or a hub name where a
network exists (`data.dataset`, with `data.dataset_config`, `data.train_split`,
`data.val_split`). What a task does with the rows (which columns, how a missing validation split
is held out, how they are tokenized) stays with the task: app/components/data/labelled/texts.py,
app/components/data/lm/rows.py.
"""

from __future__ import annotations

import glob
import logging
import os
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from app.core.errors import ConfigError, first_line

if TYPE_CHECKING:
    from datasets import Dataset, DatasetDict, Features

    from app.components.data.config import DataConfig

log = logging.getLogger(__name__)
FILE_FORMATS = {
    ".jsonl": "json",
    ".json": "json",
    ".csv": "csv",
    ".tsv": "csv",
    ".parquet": "parquet",
}
# Below this many rows one process tokenizes faster than several can start (data.map_num_proc=auto).
PARALLEL_MAP_ROWS = 100_000
# Bump when what a task gets from the same rows changes (2: rows with a null text are dropped, not
# read as "" or "None"): the tasks' caches key on dataset_identity, which includes it.
ROWS_VERSION = 2
# Arrow types a text column may have; "null" is a column with no value at all (every row dropped).
TEXT_DTYPES = ("string", "large_string", "null")


@dataclass
class RowSplits:
    """The rows a config names, before the task holds out anything."""

    train: Dataset
    val: Dataset | None  # None: no validation split given, the task holds one out
    features: Features  # the train split's (a ClassLabel's names live here)


@dataclass
class FileSet:
    """Files of one format, as `datasets` reads them."""

    files: list[str]
    builder: str  # json | csv | parquet
    options: dict[str, str]  # extra arguments to load_dataset (a TSV's delimiter)
    key: str  # the setting that named them, for messages: data.paths | data.val_paths
    split: str  # train | validation, for messages


# ---------------------------------------------------------------------------------------------
# Files


def expand_paths(patterns: list[str], key: str = "data.paths") -> list[str]:
    files: set[str] = set()
    for pattern in patterns:
        matches = [
            os.path.abspath(m)
            for m in glob.glob(os.path.expanduser(pattern), recursive=True)
            if os.path.isfile(m)
        ]
        if not matches:
            raise ConfigError(f"{key}: no file matches {pattern!r}{_directory_hint(pattern)}")
        files.update(matches)
    return sorted(files)


def _directory_hint(pattern: str) -> str:
    """A directory is not a file list: suggest the glob that most likely means its files."""
    path = Path(pattern).expanduser()
    if not path.is_dir():
        return ""
    suffixes = Counter(p.suffix for p in path.iterdir() if p.is_file() and p.suffix)
    suffix = suffixes.most_common(1)[0][0] if suffixes else ".jsonl"
    return f" (a directory); give a glob such as '{path / ('*' + suffix)}'"


@contextmanager
def quiet_datasets() -> Iterator[None]:
    """`datasets` logs a read failure ("Failed to load JSON from file ...") before raising it;
    the one `error:` line made of the exception is all the user should see."""
    from datasets.utils import logging as datasets_logging

    before = datasets_logging.get_verbosity()
    datasets_logging.set_verbosity(datasets_logging.CRITICAL)
    try:
        yield
    finally:
        datasets_logging.set_verbosity(before)


def file_fingerprints(files: list[str]) -> list[list[str | int]]:
    return [[f, (st := os.stat(f)).st_size, st.st_mtime_ns] for f in files]


def file_set(patterns: list[str], key: str, split: str) -> FileSet:
    """The files `patterns` match, checked: they exist, share a known format, are not all empty."""
    files = expand_paths(patterns, key)
    allowed = ", ".join(sorted(FILE_FORMATS))
    for f in files:
        if Path(f).suffix.lower() not in FILE_FORMATS:
            raise ConfigError(
                f"{key}: {f}: unsupported file type {Path(f).suffix or '(none)'!r}; give "
                f"files of one format: {allowed}"
            )
    builders = {FILE_FORMATS[Path(f).suffix.lower()] for f in files}
    if len(builders) != 1:
        raise ConfigError(f"{key}: {files[0]}...: give files of one format: {allowed}")
    if all(os.path.getsize(f) == 0 for f in files):
        raise ConfigError(f"data: the {split} split is empty ({key}={', '.join(files)})")
    tsv = all(f.lower().endswith(".tsv") for f in files)
    return FileSet(files, builders.pop(), {"delimiter": "\t"} if tsv else {}, key, split)


def read_files(fs: FileSet) -> Dataset:
    import datasets

    datasets.disable_progress_bars()
    try:
        with quiet_datasets():
            return datasets.load_dataset(
                fs.builder, data_files=fs.files, split="train", **fs.options
            )
    except Exception as exc:  # a malformed file, or files that disagree: which one, and why
        raise read_error(fs, exc) from None


def read_error(fs: FileSet, exc: BaseException) -> ConfigError:
    """The library's error names neither the file at fault nor, for files whose columns differ,
    the cause ("An error occurred while generating the dataset"): read each file alone to say."""
    columns: dict[str, list[str]] = {}
    for f in fs.files:
        try:
            columns[f] = list(first_row(_one_file(fs, f)) or {})
        except ConfigError as unreadable:  # names this file
            return unreadable
    first = fs.files[0]
    for f in fs.files[1:]:
        if set(columns[f]) != set(columns[first]):
            return ConfigError(
                f"{fs.key}: {f} has columns {', '.join(columns[f]) or '(none)'}, not those of "
                f"{first} ({', '.join(columns[first]) or '(none)'}); give files with the same "
                "columns"
            )
    cause = exc.__cause__ or exc  # DatasetGenerationError wraps the reader's own error
    where = first if len(fs.files) == 1 else f"{len(fs.files)} files ({first}, ...)"
    return ConfigError(f"{fs.key}: cannot read {where} as {fs.builder} ({first_line(cause)})")


def _one_file(fs: FileSet, f: str) -> FileSet:
    return FileSet([f], fs.builder, fs.options, fs.key, fs.split)


def first_row(fs: FileSet) -> dict[str, object] | None:
    """The first row, read by streaming: the columns are known without converting the files."""
    import datasets

    try:
        with quiet_datasets():
            stream = datasets.load_dataset(
                fs.builder, data_files=fs.files, split="train", streaming=True, **fs.options
            )
            return next(iter(stream), None)
    except StopIteration:  # what the JSON reader raises for a file of blank lines
        return None
    except Exception as exc:
        raise ConfigError(
            f"{fs.key}: cannot read {fs.files[0]} as {fs.builder} ({first_line(exc)})"
        ) from None


# ---------------------------------------------------------------------------------------------
# Saved or hub datasets


def is_local_dataset(name: str) -> bool:
    """A directory (or a path that means one) rather than a hub name such as `org/name`."""
    return name.startswith(("/", "~", "./", "../")) or Path(name).expanduser().exists()


def open_dataset(name: str, config: str | None) -> Dataset | DatasetDict:
    """A `Dataset` or `DatasetDict`: load_from_disk for a directory, load_dataset for a hub name."""
    import datasets

    datasets.disable_progress_bars()
    path = Path(name).expanduser()
    if is_local_dataset(name) and not path.is_dir():
        what = "a file, not a directory" if path.exists() else "no such directory"
        raise ConfigError(
            f"data.dataset={name}: {what}; give a directory written by save_to_disk (files go "
            "in data.paths)"
        )
    try:
        with quiet_datasets():
            if path.is_dir():
                return datasets.load_from_disk(str(path))
            return datasets.load_dataset(name, config)
    except Exception as exc:
        raise ConfigError(
            f"data.dataset={name!r} could not be opened ({first_line(exc)}); give a directory "
            "written by save_to_disk or a hub name the machine can reach"
        ) from None


def pick_split(loaded: DatasetDict, name: str, key: str) -> Dataset:
    if name not in loaded:
        raise ConfigError(
            f"{key}={name!r} is not a split of data.dataset; it has {', '.join(loaded)}"
        )
    return loaded[name]


def dataset_splits(
    loaded: Dataset | DatasetDict, data_cfg: DataConfig
) -> tuple[Dataset, Dataset | None]:
    """(train, validation or None) of what open_dataset returned."""
    import datasets

    if isinstance(loaded, datasets.Dataset):  # one split saved: the task holds out validation
        return loaded, None
    train = pick_split(loaded, data_cfg.train_split, "data.train_split")
    if data_cfg.val_split in loaded:
        return train, pick_split(loaded, data_cfg.val_split, "data.val_split")
    return train, None


# ---------------------------------------------------------------------------------------------
# All of it


def open_rows(data_cfg: DataConfig) -> RowSplits:
    """The rows `data.paths` / `data.val_paths` or `data.dataset` name."""
    if data_cfg.dataset:
        train, val = dataset_splits(
            open_dataset(str(data_cfg.dataset), data_cfg.dataset_config), data_cfg
        )
        if val is None:  # said here, where the rows are read, not at each check of them
            log.info(
                "no split %r: holding out %.0f%% of train",
                data_cfg.val_split,
                100 * data_cfg.val_fraction,
            )
        return RowSplits(train, val, train.features)
    train = read_files(file_set(list(data_cfg.paths), "data.paths", "train"))
    val = None
    if data_cfg.val_paths:
        val = read_files(file_set(list(data_cfg.val_paths), "data.val_paths", "validation"))
    return RowSplits(train, val, train.features)


def require_columns(columns: list[str], wanted: list[tuple[str, str]], split: str) -> None:
    """Each (setting, column) of `wanted` must be one of `columns`."""
    for key, column in wanted:
        if column not in columns:
            raise ConfigError(
                f"{key}={column!r} is not a column of the {split} split; it has "
                f"{', '.join(columns)}"
            )


def text_rows(rows: Dataset, wanted: list[tuple[str, str]], split: str) -> Dataset:
    """`rows` with text in every (setting, column) of `wanted`: a column of another type is
    refused, rows with a null text are dropped with a warning. Call before holding out a split."""
    for key, column in wanted:
        check_text_type(rows.features[column], key, column, split)
    return drop_null_texts(rows, wanted, split)


def check_text_type(feature: object, key: str, column: str, split: str) -> None:
    """From the schema, not the rows: str() of a number or a list would train on nonsense."""
    if getattr(feature, "dtype", None) in TEXT_DTYPES:  # a ClassLabel's dtype is int64
        return
    raise ConfigError(
        f"{key}={column!r} holds {feature_type(feature)} values in the {split} split; allowed: "
        "a column of strings"
    )


def feature_type(feature: object) -> str:
    """A column's type in a few words: int64, list of string, class label, struct."""
    if hasattr(feature, "names"):  # ClassLabel: ints with names
        return "class label"
    if hasattr(feature, "feature"):  # List, LargeList, Sequence
        return f"list of {feature_type(feature.feature)}"
    if isinstance(feature, dict):
        return "struct"
    return str(getattr(feature, "dtype", type(feature).__name__))


def drop_null_texts(rows: Dataset, wanted: list[tuple[str, str]], split: str) -> Dataset:
    """Rows whose text is null (JSON null, an empty CSV cell) carry no text: dropped, counted
    in a warning, the same in every task, rather than read as "" or as "None"."""
    columns = [column for _, column in wanted]
    if not any(rows.data.column(c).null_count for c in columns):  # Arrow's count: no scan
        return rows
    kept = rows.filter(
        lambda *texts: [all(t is not None for t in row) for row in zip(*texts, strict=True)],
        input_columns=columns,
        batched=True,
    )
    named = " or ".join(f"{key}={column!r}" for key, column in wanted)
    if len(kept) == 0:
        raise ConfigError(f"{named}: every row of the {split} split has a null text")
    if len(kept) < len(rows):
        log.warning("%s split: %d rows with a null %s dropped", split, len(rows) - len(kept), named)
    return kept


def dataset_identity(data_cfg: DataConfig) -> dict[str, object]:
    """What determines the rows: files by path, size and modification time; a saved dataset by
    the same of the files save_to_disk wrote (its arrow data and state); a hub name by name;
    and ROWS_VERSION, how they are read."""
    return {"rows_version": ROWS_VERSION, **_dataset_identity(data_cfg)}


def _dataset_identity(data_cfg: DataConfig) -> dict[str, object]:
    if data_cfg.dataset:
        return {
            "dataset": str(data_cfg.dataset),
            "config": data_cfg.dataset_config,
            "splits": [data_cfg.train_split, data_cfg.val_split],
            "files": file_fingerprints(saved_files(Path(str(data_cfg.dataset)).expanduser())),
        }
    ident: dict[str, object] = {"files": file_fingerprints(expand_paths(list(data_cfg.paths)))}
    if data_cfg.val_paths:
        ident["val_files"] = file_fingerprints(
            expand_paths(list(data_cfg.val_paths), "data.val_paths")
        )
    return ident


def saved_files(directory: Path) -> list[str]:
    """What save_to_disk wrote (its json state and data-*.arrow shards), not the cache-*.arrow
    files `datasets` later adds beside them when it maps or splits: they must not change a key."""
    if not directory.is_dir():
        return []
    wrote = [p for p in directory.rglob("*") if p.is_file()]
    return sorted(str(p) for p in wrote if p.suffix == ".json" or p.name.startswith("data-"))


def map_processes(fixed: int | None, n_rows: int) -> int | None:
    """`num_proc` for Dataset.map: data.map_num_proc where it is set (`fixed`), or (auto)
    several only for large data."""
    if fixed is not None:
        return fixed if fixed > 1 else None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cpus = cpus or 1
    return min(8, cpus) if n_rows >= PARALLEL_MAP_ROWS and cpus > 1 else None
