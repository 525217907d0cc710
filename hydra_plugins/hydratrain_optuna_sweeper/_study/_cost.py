"""What a study spends: training in full trials' worth, and device-seconds (train + eval time x
devices, the summary's `device_seconds`), recorded per trial as a user attribute.

- `hpo.budget_trials` (the default budget) counts training on the trials' report axis: each
  line of trials (a configuration, however many trials ran it) has spent its furthest report
  over a whole trial's (the axis's end: the data budget, or max_steps), a completed line one.
  A trial stopped at a third of its data spent a third of a trial, so what the pruner saves
  buys more trials, as ASHA and Hyperband mean it to; the figure is the same on any machine.
  Running trials count what they reported so far; checked, as the cap below, before each
  trial is handed out.

- `hpo.budget_s` caps the whole study: before each trial is handed out, the workers (whatever
  their number, on one storage) add up what the finished trials recorded; at the cap no trial
  is asked for or promoted. Running trials finish, so a study may pass its cap by what they
  spend after the last check.
- `device_seconds` as an objective (`hpo.metric=[final_val_loss, device_seconds]`) is what the
  configuration cost: a promoted or resumed trial adds what the earlier trials of its line
  spent to its own job's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import optuna
from optuna.trial import FrozenTrial, TrialState

from app.config.budget import ReportAxis

from .._pruners._learned import NOT_RUN, axis_of
from .._pruners._lineage import root
from ._settings import TrialCount

log = logging.getLogger(__name__)

COST = "device_seconds"  # the summary key, user attr and objective name
BUDGET_TRIALS = "hpo:budget_trials"  # study user attr: hpo.budget_trials, for the report


def recorded(t: FrozenTrial) -> float:
    value = t.user_attrs.get(COST)
    return float(value) if isinstance(value, int | float) and value == value else 0.0


def total(trials: Iterable[FrozenTrial]) -> float:
    return sum(recorded(t) for t in trials)


class CostCap:
    """hpo.budget_s: the device-seconds the study may spend, shared by its workers."""

    def __init__(self, study: optuna.Study, budget_s: float) -> None:
        self.study = study
        self.budget_s = budget_s
        self._said = False

    def spent(self) -> bool:
        used = total(self.study.get_trials(deepcopy=False))
        if used < self.budget_s:
            return False
        if not self._said:
            log.info(
                "hpo.budget_s=%g spent (%.1f device-seconds recorded): no more trials",
                self.budget_s,
                used,
            )
            self._said = True
        return True


class TrialsWorth:
    """hpo.budget_trials: the training a study may spend, in full trials' worth, shared by its
    workers. `reports`: the study that takes the trials' reports (the study, or its pruning
    companion); `axis`: where a trial reports and its full resource on that axis (the job's
    config, or hpo.max_resource). None: nothing declares it, so it is learned from the first
    trial that completes (`_pruners/_learned.py`); until then each finished trial counts one."""

    def __init__(self, reports: optuna.Study, budget: float, axis: ReportAxis | None) -> None:
        self.reports = reports
        self.budget = budget
        self.axis = axis

    @property
    def last(self) -> int | None:
        """A full trial's end on the report axis; None while it is not known."""
        if self.axis is None:
            self.axis = axis_of(self.reports)
            if self.axis is not None:
                log.info("%s", learned_line(self.axis, self.budget))
        return None if self.axis is None else self.axis.last

    def spent(self) -> float:
        return trials_worth(self.reports.get_trials(deepcopy=False), self.last)

    def left(self) -> bool:
        return self.spent() < self.budget - 1e-9  # three thirds are one, not 0.999...


def budget_text(b: TrialCount, budget_s: float | None, schedule: ReportAxis | None) -> str:
    """The study's budget as its first line says it: trials, or full trials' worth and what a
    full trial is (where the study knows that from, or that it learns it)."""
    cap = f", at most {budget_s:g} device-seconds (hpo.budget_s)" if budget_s else ""
    if b.per_run:
        return f"{b.n_trials} more trials ({b.key}){cap}"
    if b.worth is None:
        return f"{b.n_trials} trials in all ({b.key}){cap}"
    grid = f", at most {b.n_trials} trials (the grid)" if b.n_trials is not None else ""
    return (
        f"{b.worth:g} trials' worth of training ({b.key}{_full_trial(b.worth, schedule)}; a "
        f"trial stopped early spends less, and buys more trials){grid}{cap}"
    )


def _full_trial(worth: float, schedule: ReportAxis | None) -> str:
    """What a full trial is and where the study knows it from, or that it cannot know yet."""
    if schedule is None:
        return (
            ": a full trial's length is not known yet, since the config declares no schedule "
            "(training.max_steps with training.eval_every, or hpo.max_resource): it is learned "
            "from the first trial to complete, its last report, and until then each finished "
            "trial counts as one"
        )
    unit = schedule.unit
    return (
        f": {worth * schedule.last:,.0f} {unit}, a full trial being {schedule.last:,} {unit} "
        f"({schedule.source})"
    )


def learned_line(axis: ReportAxis, budget: float) -> str:
    """What the study says once it has learned a full trial's length."""
    return (
        f"A full trial is {axis.last:,} {axis.unit}, reported every {axis.every:,} ({axis.source}):"
        f" hpo.budget_trials={budget:g} is {budget * axis.last:,.0f} {axis.unit}, and the "
        "pruner's rungs follow it"
    )


def record_budget(study: optuna.Study, worth: float) -> None:
    """Recorded on the study, for its report (how the budget was spent)."""
    if study.user_attrs.get(BUDGET_TRIALS) != worth:
        study.set_user_attr(BUDGET_TRIALS, worth)


def trials_worth(trials: Iterable[FrozenTrial], last: int | None) -> float:
    """Full trials' worth of training: each line's furthest progress, summed."""
    lines: dict[int, float] = {}
    for t in trials:
        line = root(t)
        lines[line] = max(lines.get(line, 0.0), _progress(t, last))
    return sum(lines.values())


def _progress(t: FrozenTrial, last: int | None) -> float:
    if t.user_attrs.get("reason") in NOT_RUN:  # told at once or borrowed: never trained here
        return 0.0
    if t.state == TrialState.COMPLETE:
        return 1.0
    if last is None:
        return 1.0 if t.state.is_finished() else 0.0
    step = t.last_step
    return 0.0 if step is None else min(1.0, step / last)


def line_cost(study: optuna.Study, trial: FrozenTrial, own: float) -> float:
    """What trial's configuration cost: `own` (its job's) and what the other trials of its
    line recorded."""
    line = root(trial)
    others = [
        t for t in study.get_trials(deepcopy=False) if root(t) == line and t.number != trial.number
    ]
    return own + total(others)
