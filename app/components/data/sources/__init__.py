"""Where samples come from (`data.source`), one module each (the built-in corpus, text files,
rows through `datasets`, ...).

A source says what samples it gives (app/components/data/kinds.py: a task that reads those is
served), what its settings must hold (checked with the config) and what its files must hold
(checked before any work, without reading them whole). What a task does with the samples stays
with the task.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from app.components.data.kinds import SampleKind
from app.core.registry import Registry

if TYPE_CHECKING:
    from app.components.data.config import DataConfig


class Task(Protocol):
    """What a data source asks of the task it serves (app/components/tasks)."""

    @property
    def name(self) -> str: ...

    @property
    def builtin_corpus(self) -> str: ...

    @property
    def builtin_columns(self) -> tuple[str, ...] | None: ...

    def row_columns(self, data: DataConfig) -> list[tuple[str, str]]: ...


def _nothing(data: DataConfig, task: Task) -> None:
    return None


@dataclass(frozen=True)
class DataSource:
    name: str  # data.source=NAME
    gives: tuple[SampleKind, ...]  # the kinds of samples it gives: it serves tasks reading one
    check: Callable[[DataConfig, Task], None] = _nothing  # its settings, for this task
    check_files: Callable[[DataConfig, Task], None] = _nothing  # its files, before any work
    reads_files: bool = False  # rows from files that can change between two runs


SOURCES: Registry[DataSource] = Registry(__name__, "data.source")
