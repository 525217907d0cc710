"""Typed outcomes of a run. The sweeper maps each to an Optuna trial state in one place."""

from __future__ import annotations


class RunOutcome(Exception):
    """Base of the ways a run can end early; `status` goes into summary.json."""

    status = "failed"


class TrainingOOM(RunOutcome):
    """Out of memory even at micro-batch 1 (or with recovery off): HPO prunes the trial."""

    status = "oom"


class Diverged(RunOutcome):
    """The loss became NaN or inf: HPO fails the trial with reason=diverged."""

    status = "diverged"


class Pruned(RunOutcome):
    """The reporter said this run is hopeless: HPO records the trial as pruned."""

    status = "pruned"


class Preempted(RunOutcome):
    """SIGTERM/SIGINT: the run saved a checkpoint and its summary and stopped; it resumes with
    `training.resume=auto`. HPO records the trial as failed with reason=preempted (it can be
    retried) and the worker stops cleanly."""

    status = "preempted"

    def __init__(self, message: str, signum: int = 0, step: int = 0) -> None:
        super().__init__(message)
        self.signum = signum  # the exit status is 128 + signum, as for a process it killed
        self.step = step  # optimizer steps done and saved


class WriteFailed(RunOutcome):
    """A checkpoint could not be written (disk full, I/O error); the earlier ones are intact."""

    status = "failed"
