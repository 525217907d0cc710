"""Typed outcomes of a run: how it ended (`Status`, what summary.json says) and the exceptions
that end it early. The sweeper maps each status to an Optuna trial state in one place."""

from __future__ import annotations

import sys
from enum import Enum


class Status(str, Enum):
    RUNNING = "running"
    COMPLETED = "completed"
    NOT_STARTED = "not_started"  # refused by a setting before any work
    OOM = "oom"  # out of memory even at micro-batch 1
    DIVERGED = "diverged"  # the loss became NaN or inf
    PRUNED = "pruned"  # the trial's pruner stopped it
    PREEMPTED = "preempted"  # SIGTERM/SIGINT: checkpointed, resumable
    PAUSED = "paused"  # stopped at a rung by hpo.pruner=asha: checkpointed, may be promoted
    FAILED = "failed"  # anything else


class RunOutcome(Exception):
    """Base of the ways a run can end early; `status` goes into summary.json."""

    status = Status.FAILED


class TrainingOOM(RunOutcome):
    """Out of memory even at micro-batch 1 (or with recovery off): HPO prunes the trial."""

    status = Status.OOM


class Diverged(RunOutcome):
    """The loss became NaN or inf: HPO fails the trial with reason=diverged."""

    status = Status.DIVERGED


class Pruned(RunOutcome):
    """The reporter said this run is hopeless: HPO records the trial as pruned."""

    status = Status.PRUNED


class Preempted(RunOutcome):
    """SIGTERM/SIGINT: the run saved a checkpoint and its summary and stopped; it resumes with
    `training.resume=auto`. HPO records the trial as failed with reason=preempted (it can be
    retried) and the worker stops cleanly."""

    status = Status.PREEMPTED

    def __init__(self, message: str, signum: int = 0, step: int = 0) -> None:
        super().__init__(message)
        self.signum = signum  # the exit status is 128 + signum, as for a process it killed
        self.step = step  # optimizer steps done and saved


class Paused(RunOutcome):
    """The trial's pruner (hpo.pruner=asha) paused it at a rung: the run saved a checkpoint at
    `step` and stopped. The sweeper may promote it later: it then resumes from that checkpoint
    exactly, as a preempted run does."""

    status = Status.PAUSED

    def __init__(self, message: str, step: int = 0) -> None:
        super().__init__(message)
        self.step = step


class WriteFailed(RunOutcome):
    """A checkpoint could not be written (disk full, I/O error); the earlier ones are intact."""

    status = Status.FAILED


def status_of(exc: BaseException) -> Status | None:
    """How an exception ended a run: its status for the outcomes above and for an out-of-memory
    error torch raised itself; None for anything else (an error)."""
    if isinstance(exc, RunOutcome):
        return exc.status
    torch = sys.modules.get("torch")  # never imported here: a run that raised it had it
    if torch is not None and isinstance(exc, torch.OutOfMemoryError):
        return Status.OOM
    return None
