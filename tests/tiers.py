"""The test tiers, and the rule that keeps them honest.

Every test is in one tier, from its marks (a module's `pytestmark` or the test's own):

- `unit`: no process started, no training past a few steps (seconds for the whole tier);
- `integration`: runs and sweeps in this process (the trainer, the sweeper, the report);
- `e2e`: what starts programs: the CLI's exit status and output, torchrun, fleets of workers,
  PostgreSQL, Chromium, the GPU suite's dry run.

A test file names its tier; a test may name another (e2e wins over integration, integration
over unit). The README's test command runs unit + integration (`-m "not e2e"`), `.ci/run` then
runs e2e. The rule: outside e2e no program is started, in a test or in any fixture it uses.
Starting one goes through `_posixsubprocess.fork_exec` (subprocess keeps its own reference;
multiprocessing's spawn, torchrun's agent) or `os.posix_spawn`, each refused there with a line
naming the test, so a process cannot slip into the fast tiers unnoticed. A plain `os.fork` (a
data loader's workers) is not a program start and stays allowed.

Some programs are started by a library, once per home, the first time it is used: matplotlib's
font list runs `fc-list`, `platform.processor()` runs `uname -p`. On a machine that ran the suite
before they are cached and never start, so the rule passed there and failed the first run on a
new machine. tests/first_run.py gives every session empty caches of its own (each session is a
first run) and builds those things once, before the rule is armed: a test still may not start
them, and a library that starts one on first use fails the fast tiers everywhere, not only on a
new machine.
"""

from __future__ import annotations

import _posixsubprocess
import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

TIERS = ("unit", "integration", "e2e")


class ProcessInFastTier(RuntimeError):
    pass


def tier_of(item: pytest.Item) -> str | None:
    for name in reversed(TIERS):
        if item.get_closest_marker(name) is not None:
            return name
    return None


def check_tiers(items: list[pytest.Item]) -> None:
    """Each test collected has a tier: a new file without one fails the collection."""
    missing = sorted({item.nodeid.split("::")[0] for item in items if tier_of(item) is None})
    if missing:
        raise pytest.UsageError(
            "no tier for " + ", ".join(missing) + ": add `pytestmark = pytest.mark.unit` "
            "(or integration, e2e) to the file (tests/tiers.py)"
        )


@contextmanager
def programs_refused(item: pytest.Item) -> Iterator[None]:
    """While a non-e2e test (or a fixture it asks for) runs, starting a program fails it.
    With TIERS_RECORD=FILE the offenders are listed there instead (to sort a suite into tiers)."""
    if tier_of(item) == "e2e":
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        for owner, name in _STARTS:
            if hasattr(owner, name):
                mp.setattr(owner, name, _refusal(item, getattr(owner, name)))
        yield


_STARTS = (
    (_posixsubprocess, "fork_exec"),
    (subprocess, "_fork_exec"),
    (os, "posix_spawn"),
    (os, "posix_spawnp"),
)


def _refusal(item: pytest.Item, real: Callable[..., Any]) -> Callable[..., Any]:
    record = os.environ.get("TIERS_RECORD")

    def refuse(*args: Any, **kwargs: Any) -> Any:
        if record:
            with open(record, "a") as out:
                out.write(f"{item.nodeid}\t{_program(args)}\n")
            return real(*args, **kwargs)
        raise ProcessInFastTier(
            f"{item.nodeid} starts a program ({_program(args)}) but is not marked e2e "
            "(tests/tiers.py): mark it e2e or keep it in this process"
        )

    return refuse


def _program(args: tuple[Any, ...]) -> str:
    argv = (
        args[1]
        if len(args) > 1 and isinstance(args[0], (str, bytes))
        else args[0]
        if args
        else None
    )
    if isinstance(argv, (list, tuple)) and argv:
        words = [a.decode() if isinstance(a, bytes) else str(a) for a in argv[:4]]
        return " ".join(words)
    return "?"
