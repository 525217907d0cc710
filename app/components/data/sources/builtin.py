"""`data.source=builtin`: the task's own generated corpus (no download): stories, arithmetic and
lists for causal LM (app/components/data/lm/corpus.py), premise/hypothesis pairs for classification
(app/components/data/labelled/nli_corpus.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.components.data.kinds import LABELLED_TEXT, TEXT
from app.components.data.sources import SOURCES, DataSource
from app.core.errors import ConfigError

if TYPE_CHECKING:
    from app.components.data.config import DataConfig
    from app.components.data.sources import Task


def check(d: DataConfig, task: Task) -> None:
    """A column the task's built-in corpus lacks most often means another task's data config
    was kept (data=tiny_corpus, the default, with task=classification)."""
    columns = task.builtin_columns
    if columns is None:
        return
    for key, column in task.row_columns(d):
        if column is not None and column not in columns:
            raise ConfigError(
                f"{key}={column!r} is not a column of the built-in {task.builtin_corpus} that "
                f"data={d.name} gives task={task.name} ({', '.join(columns)}); labelled data: "
                "data=tiny_nli, data=mnli, or data.source=datasets with your files"
            )


# Each task that has a built-in corpus (Task.builtin_corpus) reads it.
SOURCES.add(DataSource("builtin", gives=(TEXT, LABELLED_TEXT), check=check))
