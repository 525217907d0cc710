"""Lockstep: worker processes take turns, one training step each, so a drifting machine hits
every contender alike.

On a shared CPU the speed of the machine drifts by several percent within seconds: more than the
differences a benchmark is after. Contenders run one after another each meet a different patch
of that drift, and contenders run at the same time compete for the cores. In lockstep each
contender keeps its own process (its own imports, allocator and peak memory) and has the whole
machine during its step, while the steps of all contenders follow each other within a second.

The parent holds two pipes per worker. A worker writes one byte when it is ready for its first
step and after every step, then blocks (using no CPU) until the parent writes one byte back. The
byte after its last step releases it to finish. Workers are started one at a time, each setting
up alone, so the time to its first step is not inflated by the others.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

TURN_TIMEOUT_S = 1800.0  # one step (or a worker's set-up) longer than this counts as hung


class Baton:
    """The worker's end: `pass_()` after set-up and after every step."""

    def __init__(self, go_fd: int, done_fd: int) -> None:
        self.go_fd, self.done_fd = go_fd, done_fd

    def pass_(self) -> None:
        os.write(self.done_fd, b".")
        if os.read(self.go_fd, 1) == b"":
            raise SystemExit("lockstep: the parent went away")


@dataclass
class Lane:
    """The parent's end of one worker."""

    key: object
    log_path: Path
    child_fds: tuple[int, int] = (-1, -1)  # (go read end, done write end), for the worker
    go_w: int = -1
    done_r: int = -1
    proc: subprocess.Popen | None = None
    alive: bool = False
    fds: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        go_r, self.go_w = os.pipe()
        self.done_r, done_w = os.pipe()
        self.child_fds = (go_r, done_w)
        self.fds = [go_r, self.go_w, self.done_r, done_w]

    def start(self, argv: list[str], env: dict[str, str]) -> bool:
        """Launch the worker and wait until it is ready for its first step."""
        with self.log_path.open("w") as log:  # a file, not a pipe: nobody reads while it runs
            self.proc = subprocess.Popen(
                argv, env=env, pass_fds=self.child_fds, stdout=log, stderr=subprocess.STDOUT
            )
        for fd in self.child_fds:
            os.close(fd)
            self.fds.remove(fd)
        self.alive = True
        return self._wait_done()

    def turn(self) -> bool:
        """Let the worker run one step (or finish, after its last); False once it is gone."""
        if not self.alive:
            return False
        try:
            os.write(self.go_w, b".")
        except BrokenPipeError:
            self.alive = False
            return False
        return self._wait_done()

    def _wait_done(self) -> bool:
        ready, _, _ = select.select([self.done_r], [], [], TURN_TIMEOUT_S)
        if not ready or os.read(self.done_r, 1) == b"":
            self.alive = False
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()  # hung: a lane that stopped answering is failed, not waited on
        return self.alive

    def finish(self) -> int:
        """Release the worker after its last step and wait for it to exit; its exit status."""
        if self.alive:
            with contextlib.suppress(BrokenPipeError):
                os.write(self.go_w, b".")
        for fd in self.fds:
            os.close(fd)
        self.fds = []
        return self.proc.wait() if self.proc is not None else -1

    def log_tail(self, lines: int = 3) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(text[-lines:])


def run_turns(lanes: list[Lane], steps: int) -> None:
    """`steps` turns; in turn t the lanes go in an order rotated by t, so each lane runs first,
    second, ... equally often (whoever runs right after a set-up or a slow neighbour is not
    always the same)."""
    for t in range(steps):
        shift = t % len(lanes)
        for lane in lanes[shift:] + lanes[:shift]:
            lane.turn()
