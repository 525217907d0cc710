"""A study as its report reads it: typed records of trials and of their lines.

The sweeper (or `python -m app.report`, for any study) turns Optuna's trials into these; the
figures and the page read nothing else. A *line* is one configuration run as several trials (a
paused trial and its promotion, a preempted trial and its re-queued copy): a learning curve is
drawn per line, not per trial.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from app.studies.transfer import Transfer

# How a trial (or a line) ended, with the colour the report draws it in.
Ending = Literal[
    "complete",
    "promoted",
    "pruned",
    "paused",
    "oom",
    "diverged",
    "preempted",
    "failed",
    "running",
    "borrowed",
]
COLOURS: dict[Ending, str] = {
    "complete": "#2ca02c",
    "promoted": "#17becf",  # completed after asha paused it and promoted it
    "pruned": "#7f7f7f",
    "paused": "#bcbd22",  # paused by asha at a rung, never promoted
    "oom": "#9467bd",
    "diverged": "#ff7f0e",
    "preempted": "#8c564b",
    "failed": "#d62728",
    "running": "#1f77b4",
    "borrowed": "#c7c7c7",  # observed from an earlier study (hpo.warm_start), not run here
}
# Trials the sweeper told without running them (a duplicate of a finished configuration, a
# surplus past the budget, a trial borrowed from an earlier study): no curve, no cost.
NOT_RUN = ("duplicate", "surplus", "borrowed")


@dataclass(frozen=True)
class TrialRecord:
    """One Optuna trial, with what the sweeper recorded on it (None where a study has no such
    record: a study of plain Optuna has states, values, params and reports only)."""

    number: int
    state: str  # Optuna's TrialState name
    ending: Ending
    line: int  # the number of the line's first trial (its own for most trials)
    values: tuple[float, ...] | None = None
    params: dict[str, object] = field(default_factory=dict)  # as Optuna gives them
    curve: tuple[tuple[int, float], ...] = ()  # (report axis, reported value), in order
    started: datetime | None = None
    ended: datetime | None = None
    worker: str | None = None  # which worker ran it ("worker 0", or host:pid outside a fleet)
    devices: str | None = None  # CUDA_VISIBLE_DEVICES as its worker saw it
    device_seconds: float | None = None
    micro_batch_size: int | None = None
    grad_accum_steps: int | None = None
    batch_source: str | None = None  # fixed | probed | cached | reduced_after_oom
    # An adaptive batch (training.batch_schedule=adaptive): (samples seen, effective batch)
    # where each of its batches began; () for a fixed batch
    batches: tuple[tuple[int, int], ...] = ()
    run_dir: str | None = None
    reason: str = ""  # the sweeper's reason for a trial that did not complete
    command: str | None = None  # what reproduces it (`python -m app.train ...`)

    @property
    def ran(self) -> bool:
        return self.reason not in NOT_RUN and self.state != "WAITING"

    @property
    def reached(self) -> int | None:
        return self.curve[-1][0] if self.curve else None


@dataclass(frozen=True)
class Line:
    """One configuration's trials, in order: its curve is theirs joined, its ending the last's."""

    trials: tuple[TrialRecord, ...]

    @property
    def root(self) -> TrialRecord:
        return self.trials[0]

    @property
    def last(self) -> TrialRecord:
        return self.trials[-1]

    @property
    def ending(self) -> Ending:
        paused = any(t.ending == "paused" for t in self.trials[:-1])
        if paused and self.last.ending == "complete":
            return "promoted"
        return self.last.ending

    @property
    def curve(self) -> list[tuple[int, float]]:
        """Every report of the line, by axis position (a resumed copy's win over its parent's)."""
        points: dict[int, float] = {}
        for t in self.trials:
            points.update(dict(t.curve))
        return sorted(points.items())

    @property
    def pauses(self) -> list[int]:
        """Where the line was paused (each a point on its curve)."""
        return [r for t in self.trials if t.ending == "paused" and (r := t.reached) is not None]

    def worth(self, budget: int | None) -> float:
        """The training this line spent, in full trials: its furthest report over `budget`
        (one when it completed), as hpo.budget_trials counts it."""
        if any(t.state == "COMPLETE" for t in self.trials):
            return 1.0
        reached = [r for t in self.trials if (r := t.reached) is not None]
        if budget is None:
            return 1.0
        return min(1.0, max(reached) / budget) if reached else 0.0

    @property
    def label(self) -> str:
        if len(self.trials) == 1:
            return f"trial {self.root.number}"
        return f"trial {self.root.number} (trials {', '.join(str(t.number) for t in self.trials)})"


@dataclass(frozen=True)
class StudyRecord:
    """The study: its name, objectives, report axis and trials."""

    name: str
    directions: tuple[str, ...]  # "minimize" | "maximize", one per objective
    metrics: tuple[str, ...]  # the objectives' names ("objective 0"... for a plain study)
    trials: tuple[TrialRecord, ...]
    unit: str = "steps"  # what the trials' reports are counted in
    budget: int | None = None  # where a trial that is never pruned stops, on that axis
    storage: str = ""  # shown with any password masked
    budget_trials: float | None = None  # hpo.budget_trials, where the study was budgeted so
    transfer: Transfer | None = None  # a μP study's target (app/studies/transfer.py)

    @property
    def ran(self) -> list[TrialRecord]:
        return [t for t in self.trials if t.ran]

    def lines(self) -> list[Line]:
        by_root: dict[int, list[TrialRecord]] = {}
        for t in sorted(self.ran, key=lambda t: t.number):
            by_root.setdefault(t.line, []).append(t)
        return [Line(tuple(ts)) for ts in by_root.values()]

    def best(self) -> TrialRecord | None:
        """The best completed trial of a single-objective study."""
        done = [t for t in self.ran if t.state == "COMPLETE" and t.values]
        if len(self.directions) != 1 or not done:
            return None
        sign = -1.0 if self.directions[0] == "maximize" else 1.0
        return min(done, key=lambda t: sign * t.values[0])  # type: ignore[index]

    def full_budget(self) -> int | None:
        """The axis position an unpruned trial reaches: the budget, else the furthest report."""
        if self.budget is not None:
            return self.budget
        reached = [r for t in self.trials if (r := t.reached) is not None]
        return max(reached) if reached else None


def endings(trials: Iterable[TrialRecord]) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in trials:
        out[t.ending] = out.get(t.ending, 0) + 1
    return out
