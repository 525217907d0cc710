"""Run a command in its own process group with a time limit, its output in a log file.

Every command starts a new session (`start_new_session=True`), so its process group holds the
trainer and everything it starts (data-loader workers, compile workers, torchrun's ranks): a
time-out, or the suite itself being stopped, ends all of them and not only the first process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

# SIGTERM first: a trainer then finishes its optimizer step and writes summary.json
# (status preempted), which the report can still read. What ignores it gets SIGKILL.
GRACE_S = 10.0
TAIL_BYTES = 64 * 1024
# Every process group started and not yet stopped: a suite that is stopped ends them all, also
# those of steps running side by side in other threads (--jobs).
_LIVE: set[subprocess.Popen[bytes]] = set()
_LIVE_LOCK = threading.Lock()


@dataclass
class Outcome:
    rc: int | None  # None when the limit was reached
    timed_out: bool
    seconds: float


def run_command(
    argv: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    limit_s: float,
    log_path: Path,
    grace_s: float = GRACE_S,
) -> Outcome:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log_path, "wb") as log:
        proc = _start(argv, cwd, env, log)
        rc: int | None = None
        try:
            rc = proc.wait(timeout=max(limit_s, 0.1))
        except subprocess.TimeoutExpired:
            pass
        finally:
            # Also on KeyboardInterrupt or a signal: no child outlives the suite.
            stop_group(proc, grace_s)
    return Outcome(rc, rc is None, time.monotonic() - started)


def _start(
    argv: list[str], cwd: Path, env: dict[str, str], log: IO[bytes]
) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    with _LIVE_LOCK:
        _LIVE.add(proc)
    return proc


def stop_all(grace_s: float = GRACE_S) -> None:
    with _LIVE_LOCK:
        procs = list(_LIVE)
    for proc in procs:
        stop_group(proc, grace_s)


def stop_group(proc: subprocess.Popen[bytes], grace_s: float = GRACE_S) -> None:
    """End the process and every member of its group; stragglers of a finished one too."""
    pgid = proc.pid  # start_new_session: the leader's pid is the group's id
    if proc.poll() is None:
        _signal_group(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    _signal_group(pgid, signal.SIGKILL)
    if proc.poll() is None:  # not a group leader after all: at least the process itself
        proc.kill()
        proc.wait()
    with _LIVE_LOCK:
        _LIVE.discard(proc)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone
        os.killpg(pgid, sig)


def tail(path: Path, lines: int = 30) -> list[str]:
    """The last lines of a log; progress bars' carriage returns count as line ends."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - TAIL_BYTES))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    kept = [line.rstrip() for line in text.splitlines() if line.strip()]
    return kept[-lines:]


class Background:
    """A helper process that runs beside a step's commands (e.g. one that holds GPU memory)."""

    def __init__(self, argv: list[str], *, cwd: Path, env: dict[str, str], log_path: Path):
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = _start(argv, cwd, env, self._log)

    def wait_for(self, text: str, timeout_s: float) -> bool:
        """True once `text` is in its output; False if it exits or the time runs out first."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if text in self.log_path.read_text(errors="replace"):
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.2)
        return False

    def stop(self) -> None:
        stop_group(self.proc, grace_s=2.0)
        self._log.close()
