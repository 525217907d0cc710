"""What a step sees: where it writes, the mode (GPU or CPU dry run), and `sh`, which runs one
command (or records why it did not) within the step's time limit."""

from __future__ import annotations

import contextlib
import shlex
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from app.gpu_suite import breaks, configcheck
from app.gpu_suite.report import Check, CommandRecord, StepRecord
from app.gpu_suite.runner import Background, Outcome, run_command, tail

DRY_COMMAND_LIMIT_S = 120.0
TAIL_LINES = 30


class StepTimeUp(Exception):
    """The step's time limit is spent: its remaining commands do not start."""


@dataclass
class Suite:
    """The run as a whole: paths, environment, mode and the test seams."""

    repo: Path
    out: Path  # relative to repo when inside it: commands stay short and portable
    env: dict[str, str]
    dry: bool
    gpus: int
    device: str
    breaks: dict[str, str] = field(default_factory=dict)  # step name -> fail | hang
    grace_s: float = 10.0
    on_change: Callable[[], None] = lambda: None
    stopping: bool = False  # set when the suite is stopped: no new command starts

    @property
    def python(self) -> str:
        return sys.executable


def display(argv: list[str]) -> str:
    return shlex.join(["python" if a == sys.executable else a for a in argv])


class StepContext:
    def __init__(self, suite: Suite, rec: StepRecord, deadline: float) -> None:
        self.suite, self.rec, self.deadline = suite, rec, deadline
        self.dir = suite.out / f"{rec.number:02d}-{rec.name}"
        self.dry = suite.dry
        self._break = suite.breaks.get(rec.name)

    @property
    def gpus(self) -> int:
        return self.suite.gpus

    def py(self, *args: str) -> list[str]:
        return [self.suite.python, *args]

    def sh(
        self,
        label: str,
        gpu: list[str],
        *,
        limit_s: float,
        dry: list[str] | None = None,
        needs_gpus: int = 1,
        ok_rcs: tuple[int, ...] = (0,),
        dry_skip: str = "no CUDA",
    ) -> CommandRecord:
        """Run `gpu` on a GPU machine, `dry` (its tiny CPU stand-in) in a dry run; without
        one (`dry_skip` says why), or without enough GPUs, record it as skipped."""
        argv = dry if self.dry else gpu
        rec = CommandRecord(label, display(argv or gpu), argv or gpu)
        self.rec.commands.append(rec)
        reason = self._skip_reason(dry, needs_gpus, dry_skip)
        if reason:
            rec.reason = reason
        else:
            assert argv is not None
            self._run(rec, argv, limit_s, ok_rcs)
        if self.dry:
            self._check_config(rec, gpu)
        self.suite.on_change()
        return rec

    def _skip_reason(self, dry: list[str] | None, needs_gpus: int, dry_skip: str) -> str | None:
        if self.dry:
            return None if dry is not None else dry_skip
        if self.gpus < needs_gpus:
            return f"needs {needs_gpus} GPUs ({self.gpus} found)"
        return None

    def _run(
        self, rec: CommandRecord, argv: list[str], limit_s: float, ok: tuple[int, ...]
    ) -> None:
        if self._break:
            argv = breaks.command(self._break, self.dir / "break-pids.txt")
            rec.argv, rec.command, self._break = argv, display(argv), None
        limit = min(DRY_COMMAND_LIMIT_S if self.dry else limit_s, self.deadline - time.monotonic())
        if self.suite.stopping:
            rec.reason = "not started: the suite was stopped"
            raise StepTimeUp(rec.reason)
        if limit < 1:
            rec.status, rec.reason = "timed_out", "not started: the step's time limit is spent"
            raise StepTimeUp(rec.reason)
        rec.limit_s = round(limit, 1)
        log = self.dir / f"{_slug(rec.label)}.log"
        rec.log = str(log.relative_to(self.suite.out))
        self._started(rec)
        outcome = run_command(
            argv, cwd=self.suite.repo, env=self.suite.env, limit_s=limit, log_path=log,
            grace_s=self.suite.grace_s,
        )  # fmt: skip
        _settle(rec, outcome, ok, log)
        _prune_weights(self.dir)
        print(f"    {rec.label}: {rec.status} in {rec.seconds:.1f} s", flush=True)

    def _started(self, rec: CommandRecord) -> None:
        print(f"  {self.rec.name} / {rec.label}: {rec.command}", flush=True)

    def _check_config(self, rec: CommandRecord, gpu: list[str]) -> None:
        """Dry run: the GPU command's settings are composed and validated too, so a typo in
        one only the GPU run uses fails here and not on the device."""
        rec.gpu_command = display(gpu)
        s = self.suite
        rec.config_check = configcheck.check(s.python, gpu, s.repo, s.env)
        if rec.config_check not in (None, "ok"):
            rec.status = "failed"
            rec.reason = f"the GPU command's settings were refused: {rec.config_check}"

    def figure(self, key: str, value: object) -> None:
        """A figure for the report: any value json.dumps takes (a number, text, a list)."""
        self.rec.figures[key] = value

    def check(self, name: str, ok: bool, detail: object = "", goal: bool = False) -> bool:
        self.rec.checks.append(Check(name, bool(ok), "" if detail is None else str(detail), goal))
        return bool(ok)

    def skip(self, label: str, argv: list[str], reason: str) -> CommandRecord:
        """A command this run does not start, with the reason (a setting that does not exist
        yet, an earlier result it depends on)."""
        rec = CommandRecord(label, display(argv), argv, reason=reason)
        self.rec.commands.append(rec)
        self.suite.on_change()
        return rec

    @contextlib.contextmanager
    def hold(self, label: str, argv: list[str], ready: str, limit_s: float) -> Iterator[bool]:
        """A helper process that runs while the block's commands do (GPU only); yields
        whether it printed `ready` in time. It is stopped, with its group, on leaving."""
        rec = CommandRecord(label, display(argv), argv)
        self.rec.commands.append(rec)
        if self.dry:
            rec.reason = "no CUDA"
            yield False
            return
        log = self.dir / f"{_slug(label)}.log"
        rec.log = str(log.relative_to(self.suite.out))
        self._started(rec)
        t0 = time.monotonic()
        bg = Background(argv, cwd=self.suite.repo, env=self.suite.env, log_path=log)
        try:
            ok = bg.wait_for(ready, limit_s)
            rec.status, rec.reason = ("ok", None) if ok else ("failed", f"no '{ready}' line")
            yield ok
        finally:
            bg.stop()
            rec.seconds = round(time.monotonic() - t0, 1)
            rec.tail = [] if rec.status == "ok" else tail(log, TAIL_LINES)
            self.suite.on_change()

    @contextlib.contextmanager
    def reading(self, what: str) -> Iterator[None]:
        """Results that cannot be read (a missing summary, a renamed key) fail a check
        and the step goes on with its other commands."""
        try:
            yield
        except Exception as exc:
            self.check(f"read {what}", False, f"{type(exc).__name__}: {exc}")


def _settle(rec: CommandRecord, outcome: Outcome, ok: tuple[int, ...], log: Path) -> None:
    rec.rc, rec.seconds = outcome.rc, round(outcome.seconds, 1)
    if outcome.timed_out:
        rec.status, rec.reason = "timed_out", f"killed after its {rec.limit_s:.0f} s limit"
    elif outcome.rc in ok:
        rec.status = "ok"
    else:
        rec.status, rec.reason = "failed", f"exit status {outcome.rc}"
    if rec.status != "ok":
        rec.tail = tail(log, TAIL_LINES)


def _prune_weights(directory: Path) -> None:
    # Checkpoints and exported weights of GPT-2-sized runs are gigabytes that say nothing the
    # summaries do not; DIR has to travel back from the device.
    for pattern in ("*.pt", "*.safetensors", "*.bin"):
        for path in directory.rglob(pattern):
            path.unlink(missing_ok=True)


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in label)
