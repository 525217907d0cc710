"""`data.source=text_files`: UTF-8 text files or globs (`data.paths`), one document per
paragraph (app/components/data/lm/tokens.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from app.components.data.kinds import TEXT
from app.components.data.sources import SOURCES, DataSource
from app.core.errors import ConfigError

if TYPE_CHECKING:
    from app.components.data.config import DataConfig
    from app.components.data.sources import Task

SNIFF_BYTES = 64 * 1024


def check(d: DataConfig, task: Task) -> None:
    if not d.paths:
        raise ConfigError("data.paths is empty; data.source=text_files needs files or globs")


def check_files(d: DataConfig, task: Task) -> None:
    from app.components.data.rows import expand_paths

    for path in expand_paths(list(d.paths)):
        check_text_file(path)


def check_text_file(path: str | Path) -> None:
    """A data file must be UTF-8 text: a binary file would train the model on garbage."""
    with open(path, "rb") as f:
        head = f.read(SNIFF_BYTES)
    nul = head.find(b"\0")
    if nul >= 0:
        raise ConfigError(
            f"data.paths: {path} is not text (a NUL byte at offset {nul}); give UTF-8 text files"
        )
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 4:  # not just a character cut at the end of the sample
            raise ConfigError(
                f"data.paths: {path} is not UTF-8 text (byte 0x{head[exc.start]:02x} at offset "
                f"{exc.start}); convert it to UTF-8"
            ) from None


SOURCES.add(
    DataSource("text_files", gives=(TEXT,), check=check, check_files=check_files, reads_files=True)
)
