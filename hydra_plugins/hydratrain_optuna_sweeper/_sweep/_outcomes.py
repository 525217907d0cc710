"""A job's return (value or exception) -> the trial's state, in one place.

| the job                                   | trial state | user attr `reason` |
|-------------------------------------------|-------------|--------------------|
| returned float(s), finite                 | COMPLETE    |                    |
| raised Pruned (the pruner said so)        | PRUNED      | pruned             |
| raised Paused (hpo.pruner=asha, a rung)   | PRUNED      | paused (**)        |
| ran out of memory even at micro-batch 1   | PRUNED      | oom (infeasible)   |
| raised Diverged, or returned nan/inf      | FAIL        | diverged           |
| raised Preempted (SIGTERM/SIGINT)         | FAIL        | preempted (*)      |

| raised anything else, or returned junk    | FAIL        | error              |

(*) not counted toward the budget, queued again with the same parameters; the worker stops.
(**) with system attr hpo:paused=<step>: it may be promoted later (`_asha.py`).
"""

from __future__ import annotations

import logging
import math
import signal
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import SupportsFloat, SupportsIndex

import optuna
from hydra.core.utils import JobReturn
from omegaconf import DictConfig
from optuna.trial import TrialState

from app.core.outcomes import Status, status_of
from app.core.preemption import stop_requested

from .. import _private as private

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    state: TrialState
    values: list[float] | None = None
    attrs: dict[str, object] = field(default_factory=dict)
    preempted_by: int | None = None  # the signal that stopped the job
    paused_at: int | None = None  # the rung step hpo.pruner=asha paused the job at
    # An unexpected error's traceback, as text (the exception itself would pin the job's model):
    # logged when the outcome is recorded, not for a trial another worker failed meanwhile.
    trace: str | None = None

    @property
    def failed(self) -> bool:
        """A failure for max_failure_rate: FAIL, and not stopped by a signal."""
        return self.state == TrialState.FAIL and self.preempted_by is None

    @property
    def reason(self) -> str:
        return str(self.attrs.get("reason", ""))


def classify(ret: JobReturn, n_objectives: int, stopped_by: int | None = None) -> Outcome:
    """`stopped_by`: the signal that stopped the worker, for a job that did not start."""
    value, exc = private.job_result(ret)
    if isinstance(exc, NotStarted):
        return not_started(stopped_by)
    outcome = from_exception(exc) if exc is not None else from_value(value, n_objectives)
    run_dir = _run_dir(ret)
    if run_dir:
        outcome.attrs = {"run_dir": run_dir, **outcome.attrs}
    return outcome


def from_exception(exc: BaseException) -> Outcome:
    """The app says how its run ended (a typed status); Optuna's own TrialPruned, raised by a
    job of another app that prunes itself, is a prune too."""
    status = status_of(exc)
    if status == Status.OOM:
        return Outcome(TrialState.PRUNED, attrs=error_attrs("oom", exc))
    if status == Status.PAUSED:
        step = int(getattr(exc, "step", 0))
        attrs = {"reason": "paused", "paused_at": step}
        return Outcome(TrialState.PRUNED, attrs=attrs, paused_at=step)
    if status == Status.PRUNED or isinstance(exc, optuna.TrialPruned):
        return Outcome(TrialState.PRUNED, attrs={"reason": "pruned"})
    if status == Status.DIVERGED:
        return Outcome(TrialState.FAIL, attrs=error_attrs("diverged", exc))
    if status == Status.PREEMPTED:
        signum = int(getattr(exc, "signum", 0) or signal.SIGTERM)
        return Outcome(TrialState.FAIL, attrs=error_attrs("preempted", exc), preempted_by=signum)
    trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return Outcome(TrialState.FAIL, attrs=error_attrs("error", exc), trace=trace)


class NotStarted(Exception):
    """A job the launcher started after a stop request: it did not run (`StartUnlessStopped`)."""


class StartUnlessStopped:
    """The task function as the launcher gets it. Hydra's basic launcher runs a batch's jobs
    one after another in this process: a job it reaches after a stop request (a signal during
    an earlier job of the batch) ends at once, before the app runs, and its trial is queued
    again. Jobs in other processes (joblib, submitit) start together, before any stop."""

    def __init__(self, task_function: Callable[[DictConfig], object]) -> None:
        self.task_function = task_function

    def __call__(self, cfg: DictConfig) -> object:
        if stop_requested():
            raise NotStarted("the sweep was stopped before this trial started")
        return self.task_function(cfg)


def signal_name(status: int) -> str:
    """The signal an exit status 128 + N stands for."""
    try:
        return signal.Signals(status - 128).name
    except ValueError:
        return f"status {status}"


def not_started(signum: int | None) -> Outcome:
    """A trial of the batch that a stop request reached before its job ran: handled as a
    preempted one (not counted, queued again with its parameters for the rerun)."""
    signum = signum or signal.SIGTERM
    error = f"the sweep was stopped ({signal.Signals(signum).name}) before this trial started"
    return Outcome(
        TrialState.FAIL, attrs={"reason": "preempted", "error": error}, preempted_by=signum
    )


def error_attrs(reason: str, exc: BaseException) -> dict[str, object]:
    return {"reason": reason, "error": f"{type(exc).__name__}: {exc}"[:2000]}


def from_value(value: object, n: int) -> Outcome:
    values = _as_floats(value)
    if values is None or len(values) != n:
        kind = "a float" if n == 1 else f"a list or tuple of {n} floats"
        error = f"the job returned {value!r}; the study needs {kind}"
        return Outcome(TrialState.FAIL, attrs={"reason": "error", "error": error})
    if not all(math.isfinite(v) for v in values):
        return Outcome(
            TrialState.FAIL, attrs={"reason": "diverged", "error": f"objective {values}"}
        )
    return Outcome(TrialState.COMPLETE, values=values)


def _as_floats(value: object) -> list[float] | None:
    """The objective values a job returned (a number, or a list or tuple of them)."""
    items = list(value) if isinstance(value, list | tuple) else [value]
    floats = []
    for item in items:
        if not isinstance(item, SupportsFloat | SupportsIndex | str):
            return None
        try:
            floats.append(float(item))
        except (TypeError, ValueError):
            return None
    return floats


def _run_dir(ret: JobReturn) -> str | None:
    try:
        return str(Path(ret.hydra_cfg.hydra.runtime.output_dir).absolute())  # type: ignore[union-attr]
    except Exception:
        return None
