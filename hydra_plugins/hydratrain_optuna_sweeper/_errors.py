"""The ways a sweep ends early, each one line: Hydra prints only the message."""

from __future__ import annotations

from hydra.errors import CompactHydraException


class SweepConfigError(CompactHydraException):
    """A sweep setting the user can fix: one `error:` line and exit status 2, before any trial."""


class SweepAborted(CompactHydraException):
    """Too many failed trials: the sweep stops (exit status 1) with one line saying why."""


class NoTrialCompleted(CompactHydraException):
    """The study ended without a completed trial (exit status 1): no best value to report."""


class StorageUnreachable(CompactHydraException):
    """The study's database stayed away: the worker stops (exit status 1); rerun to resume."""


def first_line(exc: BaseException | str) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
