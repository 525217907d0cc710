"""Files that are complete or absent: write a temporary file beside the target, fsync, rename.

The temporary file lives in the target's directory so that `os.replace` is a rename on one file
system, which POSIX makes atomic: a killed process leaves the old file (or none) and at worst a
stray `.NAME.*.tmp`, never a truncated file under the real name.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def fsync_dir(directory: Path) -> None:
    """Make a rename inside `directory` durable (the directory entry itself is flushed)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
