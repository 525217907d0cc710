"""Run the selected steps in order, each within its own time limit, and write the report after
every command and every step, so a suite killed at any point still leaves one."""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from app.gpu_suite import render
from app.gpu_suite import report as rpt
from app.gpu_suite.context import StepContext, StepTimeUp, Suite
from app.gpu_suite.report import Check, CommandRecord, Report, StepRecord
from app.gpu_suite.runner import stop_all

DRY_STEP_LIMIT_S = 240.0
TRACE_LINES = 20


@dataclass(frozen=True)
class Step:
    number: int
    name: str
    title: str
    limit_s: float  # on a GPU machine, for all of the step's commands together
    body: Callable[[StepContext], None]


class Interrupted(BaseException):
    """The suite got SIGTERM/SIGINT: the step in progress is recorded, then the suite ends."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def run_steps(
    steps: list[Step],
    suite: Suite,
    report: Report,
    limits: dict[str, float],
    budget_s: float,
    jobs: int = 1,
) -> None:
    """Each step in order, or `jobs` side by side (the CPU dry run only: on a GPU, steps
    sharing the card would spoil each other's figures)."""
    lock = threading.Lock()
    suite.on_change = lambda: save(suite, report, lock)
    started = time.monotonic()
    queue = []
    for step in steps:  # every selected step is in the report, not run, before any starts
        limit = limits.get(step.name, DRY_STEP_LIMIT_S if suite.dry else step.limit_s)
        rec = StepRecord(step.number, step.name, step.title, limit_s=limit, device=suite.device)
        report.put(rec)
        queue.append((step, rec))
    suite.on_change()
    if jobs == 1:
        for step, rec in queue:
            start_within_budget(step, suite, rec, budget_s - (time.monotonic() - started))
        return
    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        no_budget = float("inf")
        futures = [pool.submit(start_within_budget, s, suite, r, no_budget) for s, r in queue]
        for future in futures:
            future.result()
    except BaseException:
        suite.stopping = True  # the other threads start nothing more
        stop_all(suite.grace_s)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def start_within_budget(step: Step, suite: Suite, rec: StepRecord, left: float) -> None:
    """A step starts only when its whole limit fits in what is left of the budget; otherwise
    it stays not run, for a later part (`--pending`)."""
    if rec.limit_s > left:
        rec.reason = f"its {rec.limit_s:.0f} s limit is over the {left:.0f} s left of the budget"
        print(f"[{step.number}] {step.name}: not run ({rec.reason})", flush=True)
    else:
        run_step(step, suite, rec, rec.limit_s)
    suite.on_change()


def run_step(step: Step, suite: Suite, rec: StepRecord, limit: float) -> None:
    print(f"[{step.number}] {step.name}: {step.title} (limit {limit:.0f} s)", flush=True)
    t0 = time.monotonic()
    ctx = StepContext(suite, rec, deadline=t0 + limit)
    rec.reason = f"started {rpt.now()}, not finished"  # what a killed suite's report says
    suite.on_change()
    error: list[str] = []
    try:
        step.body(ctx)
    except StepTimeUp:
        pass  # recorded on the command that could not start
    except Interrupted as exc:
        error = [f"interrupted by signal {exc.signum}"]
        raise
    except Exception:
        error = traceback.format_exc().strip().splitlines()[-TRACE_LINES:]
    finally:
        if suite.stopping and not error:
            error = ["interrupted: the suite was stopped"]
        rec.seconds = round(time.monotonic() - t0, 1)
        rec.finished_at = rpt.now()
        settle(rec, error)
        print(f"[{step.number}] {step.name}: {rec.status} in {rec.seconds:.1f} s", flush=True)


def settle(rec: StepRecord, error: list[str]) -> None:
    """The step's status from its commands, checks and any error, with the first reason."""
    cmds, bad_checks = rec.commands, [c for c in rec.checks if not c.ok and not c.goal]
    timed_out = [c for c in cmds if c.status == "timed_out"]
    failed = [c for c in cmds if c.status == "failed"]
    if timed_out:
        rec.status, rec.reason = "timed_out", f"{timed_out[0].label}: {timed_out[0].reason}"
    elif error or failed or bad_checks:
        rec.status = "failed"
        rec.reason = _failure_reason(error, failed, bad_checks)
    elif cmds and all(c.status == "skipped" for c in cmds):
        rec.status, rec.reason = "skipped", cmds[0].reason
    else:
        rec.status, rec.reason = "passed", None
    bad = timed_out or failed
    rec.tail = error or (bad[0].tail if bad else [])


def _failure_reason(error: list[str], failed: list[CommandRecord], bad_checks: list[Check]) -> str:
    if error:
        return error[-1]
    if failed:
        return f"{failed[0].label}: {failed[0].reason}"
    c = bad_checks[0]
    return f"check failed: {c.name}" + (f" ({c.detail})" if c.detail else "")


_SAVE_LOCK = threading.Lock()


def save(suite: Suite, report: Report, lock: threading.Lock = _SAVE_LOCK) -> None:
    with lock:
        report.header["updated"] = rpt.now()
        rpt.write(suite.out, report, render.markdown(report))
