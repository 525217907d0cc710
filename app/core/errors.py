"""The error a user can fix, and the one line a library's error is reduced to."""

from __future__ import annotations


class ConfigError(ValueError):
    """A setting the user can fix; the message is one line naming the key and what is allowed."""


def first_line(exc: BaseException | str) -> str:
    """A library's error in one line (its first non-blank one), for a ConfigError's message."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[0] if lines else (type(exc).__name__ if isinstance(exc, BaseException) else "")
