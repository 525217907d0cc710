"""`data.source=datasets`: rows through the `datasets` library: JSONL, CSV or Parquet files
(`data.paths`, `data.val_paths`), a `save_to_disk` directory or a hub name (`data.dataset`).
Reading them is app/components/data/rows.py; which columns a task reads is the task's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.components.data.kinds import LABELLED_TEXT, TEXT
from app.components.data.sources import SOURCES, DataSource
from app.core.errors import ConfigError

if TYPE_CHECKING:
    from app.components.data.config import DataConfig
    from app.components.data.sources import Task


def check(d: DataConfig, task: Task) -> None:
    if not (d.paths or d.dataset):
        raise ConfigError(
            "data.source=datasets needs data.paths (JSONL, CSV or Parquet files) or "
            "data.dataset (a save_to_disk directory or a hub name)"
        )


def check_files(d: DataConfig, task: Task) -> None:
    """Files or a saved dataset: there, readable, not empty, with the columns the task reads.
    Only a first row of each file set is read (streamed), and a saved dataset is memory-mapped,
    so nothing is converted or tokenized yet. A hub name is checked when it loads: whether it
    can be fetched depends on the network."""
    from app.components.data import rows

    wanted = task.row_columns(d)
    if d.dataset:
        name = str(d.dataset)
        if not rows.is_local_dataset(name):
            return
        train, val = rows.dataset_splits(rows.open_dataset(name, None), d)
        named = [("train", train), ("validation", val)]
        for split, part in [(s, r) for s, r in named if r is not None]:
            if len(part) == 0:
                raise ConfigError(f"data.dataset={name}: the {split} split is empty")
            rows.require_columns(part.column_names, wanted, split)
        return
    given = [("data.paths", d.paths, "train"), ("data.val_paths", d.val_paths, "validation")]
    for key, patterns, split in [g for g in given if g[1]]:
        fs = rows.file_set(list(patterns), key, split)
        row = rows.first_row(fs)
        if row is None:
            raise ConfigError(f"data: the {split} split is empty ({key}={', '.join(fs.files)})")
        rows.require_columns(list(row), wanted, split)


SOURCES.add(
    DataSource(
        "datasets",
        gives=(TEXT, LABELLED_TEXT),  # the columns a task names (Task.row_columns)
        check=check,
        check_files=check_files,
        reads_files=True,
    )
)
