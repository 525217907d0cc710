"""The error a user can fix, and the one line a library's error is reduced to."""

from __future__ import annotations

import sys
from typing import NoReturn


class ConfigError(ValueError):
    """A setting the user can fix; the message is one line naming the key and what is allowed."""


def first_line(exc: BaseException | str) -> str:
    """A library's error in one line (its first non-blank one), for a ConfigError's message."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[0] if lines else (type(exc).__name__ if isinstance(exc, BaseException) else "")


def say(line: str) -> None:
    """`line` on stderr in one write: under torchrun every rank shares the terminal (or the
    launcher's pipe), and print() writes the text and its newline apart, so two ranks ending
    together would merge their lines into one."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def fail(message: str) -> NoReturn:
    """Bad input on a command line: one `error:` line and exit status 2."""
    say(f"error: {message}")
    sys.exit(2)
