"""A full trial's resource where nothing declares it: learned from the study.

An app's config may declare no schedule (no training.max_steps and training.eval_every, no
hpo.max_resource). Then a full trial's length on the report axis is learned from the first trial
that completes, as Optuna's `HyperbandPruner(max_resource="auto")` learns it: its last reported
step is the full resource, the interval of its reports (their greatest common divisor) the
report interval. The first worker (or job) to see such a trial records the axis on the study
(`AXIS`), so every worker, every job of a launcher and a resumed sweep read the same one; the
study's budget in trials' worth (`_study/_cost.TrialsWorth`) and the pruner's rungs
(`LearnedAxisPruner`) both follow it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import optuna
from optuna.trial import FrozenTrial, TrialState

from app.config.budget import BudgetUnit, ReportAxis

AXIS = "hpo:report_axis"  # study user attr: {every, last, unit, source}
UNIT = "hpo:report_unit"  # study user attrs: the axis trials report on, and its end (the report)
BUDGET = "hpo:report_budget"
BORROWED = "borrowed"  # the reason of a trial observed from an earlier study (hpo.warm_start)
# reasons of trials the sweeper told without running them: they spent and teach nothing here
NOT_RUN = ("surplus", "duplicate", BORROWED)


def recorded_axis(study: optuna.Study) -> ReportAxis | None:
    """The axis recorded on the study (declared by the sweep, or learned), None if none yet."""
    got = study.user_attrs.get(AXIS)
    if not isinstance(got, dict):
        return None
    try:
        return ReportAxis(
            every=int(got["every"]),
            last=int(got["last"]),
            unit=BudgetUnit(got.get("unit", "steps")),
            source=str(got.get("source", "")),
        )
    except (KeyError, TypeError, ValueError):
        return None


def record_axis(study: optuna.Study, axis: ReportAxis) -> None:
    """On the study, once: what the budget counts and what the report reads."""
    attrs = study.user_attrs
    entry = {"every": axis.every, "last": axis.last, "unit": axis.unit.value, "source": axis.source}
    if attrs.get(AXIS) != entry:
        study.set_user_attr(AXIS, entry)
    record_report_end(study, axis.unit.value, axis.last)


def record_report_end(study: optuna.Study, unit: str, last: int) -> None:
    """The unit the trials report in and the last report's value, where the report reads them."""
    if study.user_attrs.get(UNIT) != unit or study.user_attrs.get(BUDGET) != last:
        study.set_user_attr(UNIT, unit)
        study.set_user_attr(BUDGET, last)


def learn_axis(trials: Iterable[FrozenTrial]) -> ReportAxis | None:
    """From the first completed trial that reported (by number): its last reported step and
    the interval of its reports; None while no trial has completed with reports."""
    for t in sorted(trials, key=lambda t: t.number):
        if t.state != TrialState.COMPLETE or t.user_attrs.get("reason") in NOT_RUN:
            continue
        steps = [s for s in t.intermediate_values if s > 0]
        if not steps:
            continue
        return ReportAxis(
            every=math.gcd(*steps),
            last=max(steps),
            source=f"learned from trial {t.number}, the first to complete: its last report",
        )
    return None


def axis_of(study: optuna.Study) -> ReportAxis | None:
    """The study's axis: recorded, or learned now (and recorded); None while unknown."""
    axis = recorded_axis(study)
    if axis is not None:
        return axis
    axis = learn_axis(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    if axis is not None:
        record_axis(study, axis)
    return axis


# Where a pruner is built before its axis is known, only to answer for its attributes
STAND_IN = ReportAxis(every=1, last=1, source="a stand-in until a trial completes")


class LearnedAxisPruner(optuna.pruners.BasePruner):
    """`hpo.pruner` for a study whose full resource is learned: until a trial has completed it
    prunes nothing (as Optuna's "auto" resources wait), unless hpo.pruner_args place its rungs
    themselves (`min_resource`); from then on it is the pruner the learned axis places (the
    rungs a declared schedule of that length would get), and a trial's report at the full
    resource is its result, never judged. `place(axis)` builds the pruner for an axis (None:
    as without one). Attributes the sweep reads of the pruner (`pauses`, asha's `eta`) are
    the current pruner's."""

    def __init__(
        self, place: Callable[[ReportAxis | None], optuna.pruners.BasePruner], placed: bool
    ) -> None:
        self._place = place
        self._placed: optuna.pruners.BasePruner | None = None
        self._axis: ReportAxis | None = None
        self._judges_unplaced = placed  # hpo.pruner_args place the rungs without an axis
        # Until the axis is known: the pruner as hpo.pruner_args place it, or (judging nothing)
        # one on a stand-in axis, for its attributes and to check its arguments now
        self._provisional = place(None if placed else STAND_IN)

    @property
    def current(self) -> optuna.pruners.BasePruner:
        return self._placed if self._placed is not None else self._provisional

    def __getattr__(self, name: str) -> object:
        if name.startswith("_"):  # not set yet (a copy being built): not the pruner's
            raise AttributeError(name)
        return getattr(self.current, name)

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        if self._placed is None and (axis := axis_of(study)) is not None:
            self._placed, self._axis = self._place(axis), axis
        if self._axis is None:
            return self._judges_unplaced and self._provisional.prune(study, trial)
        step = trial.last_step
        if step is not None and step >= self._axis.last:
            return False
        return self.current.prune(study, trial)


def current(pruner: optuna.pruners.BasePruner) -> optuna.pruners.BasePruner:
    """The pruner that judges now (a learned-axis pruner's current one)."""
    return pruner.current if isinstance(pruner, LearnedAxisPruner) else pruner
