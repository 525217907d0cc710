"""The last task data set this process loaded, kept for the next run that asks for the same.

Trials of an HPO study run one after another in the sweeper's process and mostly vary training
settings, not the data: the second trial on takes the data (tokens, tokenizer, labels) from
here instead of reading and tokenizing it again. One entry only, so memory stays bounded; the
key holds the resolved data config and the files' sizes and modification times.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from app.components.data.config import DataConfig

T = TypeVar("T")
_last: tuple[str, Any] | None = None


def data_key(task_name: str, data_cfg: DataConfig, extra: object = None) -> str:
    """The resolved data config (seed, split, source settings) and, where the rows come from
    files, their sizes and modification times."""
    from app.components.data.rows import dataset_identity
    from app.components.data.sources import SOURCES

    # Rows from files that can change between two runs of one process: their identities too.
    files = dataset_identity(data_cfg) if SOURCES.get(data_cfg.source).reads_files else None
    ident = {
        "task": task_name,
        "data": dataclasses.asdict(data_cfg),
        "files": files,
        "extra": extra,
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()


def remembered(key: str, build: Callable[[], T]) -> T:
    global _last
    if _last is not None and _last[0] == key:
        return _last[1]
    _last = None  # let the old data go before the new one is built
    value = build()
    _last = (key, value)
    return value


def forget() -> None:
    global _last
    _last = None
