"""`hpo.pruner=asha`: promotion-based asynchronous successive halving (ASHA with pausing).

Rungs are evaluation steps: the first at or after `min_resource` (by default the first
evaluation at or after max_steps / eta**2, successive halving's first rung), then eta times
further each, below max_steps. A trial that reports at a rung goes on only if it is among the
top floor(n / eta) of the n trials that reached that rung so far, itself included. Otherwise it
is paused: its run saves a checkpoint of that step and stops. With fewer than eta trials at a
rung floor(n / eta) is 0, so the first trials of a study are paused there rather than judged
against fewer than eta others. A worker asking for work first promotes the best paused trial
that now qualifies (the highest rung first), then samples a new one. When the trial budget is
spent and nothing runs, each rung also sends on its best line if it has not gone on yet (a rung
of fewer than eta lines included), so the best configuration reaches the top before the study
ends, as in successive halving. A promoted trial resumes from its checkpoint exactly; one that
is never promoted stays PRUNED with its last value.

How a pause is recorded. Optuna has no PAUSED state, and a finished trial cannot be changed:

- the paused trial ends PRUNED (value: its last report, as any pruned trial), user attrs
  `reason=paused` and `paused_at=<step>`, system attr `hpo:paused=<step>`;
- its promotion is a new trial, queued WAITING with the same parameters and the reports so far,
  user attrs `resume_from=<the paused run dir>` and `promoted_from=<number>`, system attrs
  `hpo:promoted_from` and `hpo:root` (the first trial of the line). It does not count toward
  hpo.n_trials: the paused trial holds the configuration's slot;
- a line's head (its newest trial) that is PRUNED with `hpo:paused` is paused now. All of it is
  in the storage, so a paused trial outlives the worker that ran it.

A line (`_lineage.py`) counts once at a rung, and once to the sampler (`_line_sampler.py`):
its furthest result, under the number of the trial the sampler drew. With several objectives
the reports, and so the rungs, are the pruning companion's (`_companion.py`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping

import optuna
from optuna.trial import FrozenTrial, TrialState

from .. import _private as private
from ._kind import PRUNERS, PrunerKind, ReportAxis, halving_defaults
from ._learned import current
from ._lineage import PROMOTED_FROM, ROOT, UNCOUNTED, heads, root

log = logging.getLogger(__name__)

PAUSED = "hpo:paused"  # system attr of a paused trial: the rung step it stopped at


class AshaPruner(optuna.pruners.BasePruner):
    """The pause-or-go-on decision at a rung; `prune` True means "pause" (the reporter raises
    Paused, not Pruned). `every`: the evaluation interval the rungs are placed on."""

    pauses = True  # what the trial's reporter asks: a stop here is a pause

    def __init__(
        self,
        reduction_factor: int = 3,
        min_resource: int = 1,
        max_resource: int | None = None,
        every: int = 1,
    ) -> None:
        for name, value, least in (
            ("reduction_factor", reduction_factor, 2),
            ("min_resource", min_resource, 1),
            ("max_resource", 1 if max_resource is None else max_resource, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name}={value!r} must be an integer >= {least}")
        self.eta = reduction_factor
        self.min_resource = min_resource
        self.max_resource = max_resource
        self.every = max(1, every)

    def rung_step(self, k: int) -> int:
        """Rung k's evaluation step: the first at or after min_resource * eta**k."""
        wanted = self.min_resource * self.eta**k
        return math.ceil(wanted / self.every) * self.every

    def is_rung(self, step: int) -> bool:
        if self.max_resource is not None and step >= self.max_resource:
            return False  # the last evaluation is the trial's result, never a rung
        k = 0
        while (at := self.rung_step(k)) <= step:
            if at == step:
                return True
            k += 1
        return False

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        step = trial.last_step
        if step is None or not self.is_rung(step):
            return False
        values = rung_values(study.get_trials(deepcopy=False), step)
        values[root(trial)] = trial.intermediate_values[step]
        return not qualifies(values, root(trial), self.eta, maximizes(study))


def maximizes(study: optuna.Study) -> bool:
    return study.direction == optuna.study.StudyDirection.MAXIMIZE


def rung_values(trials: Iterable[FrozenTrial], step: int) -> dict[int, float]:
    """Each line's report at `step`, by root: the trials that reached that rung."""
    out: dict[int, float] = {}
    for t in trials:
        value = t.intermediate_values.get(step)
        if value is not None and math.isfinite(value):
            out.setdefault(root(t), value)
    return out


def ranked(values: dict[int, float], maximize: bool) -> list[int]:
    """Roots best first; a tie goes to the earlier line."""
    return sorted(values, key=lambda r: (-values[r] if maximize else values[r], r))


def qualifies(values: dict[int, float], who: int, eta: int, maximize: bool) -> bool:
    """`who` is among the top floor(n / eta) of the n lines at the rung."""
    return who in ranked(values, maximize)[: len(values) // eta]


def is_paused(t: FrozenTrial) -> bool:
    return t.state == TrialState.PRUNED and PAUSED in t.system_attrs and "run_dir" in t.user_attrs


class Promoter:
    """Promotes paused trials of `study`, judged on the reports in `reports` (the study itself,
    or its pruning companion)."""

    def __init__(self, study: optuna.Study, reports: optuna.Study, eta: int) -> None:
        self.study = study
        self.reports = reports
        self.eta = eta

    def promote(self, final: bool = False) -> bool:
        """Queue the best paused trial that qualifies now; False when none does.

        `final`: the study asks for no new trial (its trial budget is spent) and nothing runs
        or waits, so every rung holds all the lines it will ever hold. Then each rung sends on
        at least its best line, as successive halving's bracket does: a rung that ended with
        fewer than eta lines (floor(n / eta) = 0) would otherwise keep its best paused, and a
        study whose trials were all paused would end with no result."""
        trials = self.study.get_trials(deepcopy=False)
        if final and any(t.state in (TrialState.RUNNING, TrialState.WAITING) for t in trials):
            return False
        chosen = self.candidate(trials, final)
        if chosen is None:
            return False
        self._queue(chosen)
        return True

    def _reported(self, trials: list[FrozenTrial]) -> list[FrozenTrial]:
        return trials if self.reports is self.study else self.reports.get_trials(deepcopy=False)

    def _queue(self, chosen: FrozenTrial) -> None:
        self.study.add_trial(promotion(chosen))
        log.info(
            "Trial %d, paused at step %d, promoted: it resumes from its checkpoint",
            chosen.number,
            chosen.system_attrs[PAUSED],
        )

    def candidate(self, trials: list[FrozenTrial], final: bool = False) -> FrozenTrial | None:
        paused = [t for t in heads(trials).values() if is_paused(t)]
        if not paused:
            return None
        reported = self._reported(trials)
        maximize = maximizes(self.reports)
        for step in sorted({int(t.system_attrs[PAUSED]) for t in paused}, reverse=True):
            here = {root(t): t for t in paused if t.system_attrs[PAUSED] == step}
            values = rung_values(reported, step)
            quota = len(values) // self.eta
            for r in ranked(values, maximize)[: max(1, quota) if final else quota]:
                if r in here:
                    return here[r]
        return None

    def is_duplicate(self, t: FrozenTrial) -> bool:
        """A second promotion of one paused trial (two workers at once on a database, where no
        lock orders them): the earlier copy runs, this one is dropped."""
        source = t.system_attrs.get(PROMOTED_FROM)
        if source is None or private.retry_history(t):
            return False
        return any(
            o.system_attrs.get(PROMOTED_FROM) == source
            and not private.retry_history(o)
            and o.number < t.number
            and o.user_attrs.get("reason") != "duplicate"
            for o in self.study.get_trials(deepcopy=False)
        )


def promotion(t: FrozenTrial) -> FrozenTrial:
    """The WAITING copy of paused trial t that resumes it."""
    attrs: dict[str, object] = {ROOT: root(t), PROMOTED_FROM: t.number, UNCOUNTED: True}
    return optuna.trial.create_trial(
        state=TrialState.WAITING,
        params=t.params,
        distributions=t.distributions,
        user_attrs={"resume_from": t.user_attrs["run_dir"], "promoted_from": t.number},
        system_attrs=attrs,
        intermediate_values=dict(t.intermediate_values),
    )


def _defaults(schedule: ReportAxis | None, args: Mapping[str, object]) -> dict[str, object]:
    """Successive halving's rungs, on the evaluation steps, up to the budget."""
    out = halving_defaults(schedule, args)
    return out if schedule is None else {**out, "max_resource": schedule.last}


def _build(args: dict[str, object], schedule: ReportAxis | None) -> AshaPruner:
    placed = {} if schedule is None else {"every": schedule.every}  # rungs on evaluations
    return AshaPruner(**args, **placed)  # type: ignore[arg-type]


def _promoter(study: optuna.Study, reports: optuna.Study) -> Promoter:
    pruner = current(reports.pruner)  # a learned axis changes the rungs, not the factor
    assert isinstance(pruner, AshaPruner)
    return Promoter(study, reports, pruner.eta)


PRUNERS.add(PrunerKind("asha", _build, _defaults, pauses=True, promoter=_promoter))
