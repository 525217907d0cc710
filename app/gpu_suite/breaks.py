"""Test seam (`--break STEP:fail` or `STEP:hang`): the step's first command is replaced by one
that fails, or by one that hangs with a child of its own, to show that a failing or timed-out
step is recorded, its process tree killed, and the suite goes on."""

from __future__ import annotations

import sys
from pathlib import Path

MODES = ("fail", "hang")

FAIL = (
    "import sys; "
    "[print(f'broken on purpose: line {i}') for i in range(40)]; "
    "print('last line before the failure', flush=True); "
    "sys.exit(3)"
)
# The parent and a child it starts (same process group) write their pids, then both sleep;
# the child ignores SIGTERM, as a stuck worker may, so only the group's SIGKILL ends it.
HANG = (
    "import os, pathlib, subprocess, sys, time; "
    "child = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
    "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)']); "
    "pathlib.Path(sys.argv[1]).write_text(f'{os.getpid()} {child.pid}'); "
    "print('hanging on purpose', flush=True); "
    "time.sleep(3600)"
)


def command(mode: str, pid_file: Path) -> list[str]:
    if mode == "fail":
        return [sys.executable, "-c", FAIL]
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    return [sys.executable, "-c", HANG, str(pid_file)]
