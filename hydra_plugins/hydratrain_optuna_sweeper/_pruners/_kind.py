"""Pruners by name (`hpo.pruner`), one module each in this room, found by name.

A pruner module registers a `PrunerKind`: how to build the Optuna pruner, the arguments it takes
by default from the study's evaluation schedule, and how the sweep treats what it stops (judged
or not, paused and resumed or ended). Adding a pruner is adding a module here: nothing else
lists or compares the names. The modules keep their leading `_` (Hydra's plugin scan imports
every other module of the plugin at each start).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from typing import Protocol

import optuna
from optuna.trial import FrozenTrial

from app.config.budget import ReportAxis
from app.config.jobs import report_axis_of
from app.core.errors import ConfigError
from app.core.registry import Registry

from .._errors import SweepConfigError
from ._learned import LearnedAxisPruner

# Passed to the halving pruners unless hpo.pruner_args sets it: successive halving's own default
# is 4, not the 3 its first rung is placed for; hyperband's is 3, passed too so that it stays so.
REDUCTION_FACTOR = 3


DECLARED = "hpo.max_resource"  # the source of a schedule the hpo node declares


def schedule_of(cfg: object) -> ReportAxis | None:
    """When a trial reports (the pruners' defaults are set from it): its report axis, the same
    for every trial of a study under a data budget; another app's `training.eval_every` up to
    `training.max_steps`, in steps; or what its hpo node declares (`hpo.max_resource`, reported
    every `hpo.report_every`, 1 if unset); None where the config has none of these (the study
    then learns it: `_learned.py`)."""
    if cfg is None:
        return None
    axis = report_axis_of(cfg)
    if axis is not None:
        return axis
    t = getattr(cfg, "training", None)
    every, last = getattr(t, "eval_every", None), getattr(t, "max_steps", None)
    if every is not None and last is not None:
        return ReportAxis(int(every), int(last), source="training.max_steps")
    return declared_axis(getattr(cfg, "hpo", None))


def declared_axis(hpo: object) -> ReportAxis | None:
    """hpo.max_resource and hpo.report_every as a report axis; None where not declared."""
    last = getattr(hpo, "max_resource", None)
    if last is None:
        return None
    every = getattr(hpo, "report_every", None)
    return ReportAxis(1 if every is None else int(every), int(last), source=DECLARED)


def check_declared(hpo: object, schedule: ReportAxis | None) -> None:
    """hpo.max_resource and hpo.report_every (of the job's hpo node) are for an app whose
    config declares no schedule: beside one (a training run's) they would be a second,
    possibly different, answer."""
    keys = [k for k in ("max_resource", "report_every") if getattr(hpo, k, None) is not None]
    if not keys or (schedule is not None and schedule.source == DECLARED):
        return  # nothing declared, or what is declared is the schedule
    if schedule is None:  # hpo.report_every alone
        every = getattr(hpo, "report_every", None)
        raise SweepConfigError(
            f"hpo.report_every={every} needs hpo.max_resource, a full trial's resource in the "
            "same unit; set both, or neither to learn them"
        )
    given = ", ".join(f"hpo.{k}={getattr(hpo, k)}" for k in keys)
    raise SweepConfigError(
        f"{given}: the job's config declares its schedule ({schedule.source}: reports every "
        f"{schedule.every:,} {schedule.unit} up to {schedule.last:,}); leave hpo.max_resource "
        "and hpo.report_every null"
    )


Defaults = Callable[[ReportAxis | None, Mapping[str, object]], dict[str, object]]
# What a pruner takes from the study's budget (and its schedule, None where the job's config
# has none): `worth` is the budget in full trials' worth (hpo.budget_trials), None where a
# count of trials (hpo.n_trials) is the budget.
BudgetDefaults = Callable[[float | None, ReportAxis | None], dict[str, object]]
# The study attribute that holds hpo.pruner_args as the sweep resolved them (budget defaults
# included): a job in another process builds the same pruner from it.
PRUNER_ARGS = "hpo:pruner_args"


def no_defaults(schedule: ReportAxis | None, args: Mapping[str, object]) -> dict[str, object]:
    return {}


class Promotes(Protocol):
    """What the study's budget asks of a pruner that pauses (asha's `Promoter`)."""

    def promote(self, final: bool = False) -> bool:
        """Queue the best paused trial that qualifies now; False when none does."""
        ...

    def is_duplicate(self, trial: FrozenTrial) -> bool:
        """A second promotion of one paused trial: the earlier copy runs, this one is dropped."""
        ...


@dataclasses.dataclass(frozen=True)
class PrunerKind:
    """One `hpo.pruner`: what a pruner module registers. Each field is a question a new pruner
    answers; the default is the answer of a plain Optuna pruner that stops trials for good.

    - `name`: what hpo.pruner calls it (the module is `_<name>.py`).
    - `build(args, schedule)`: the Optuna pruner, from hpo.pruner_args over `defaults` and the
      study's evaluation schedule (where the job's config declares none: the one the study
      learns, `_learned.py`; None where hpo.pruner_args place the rungs before then).
    - `defaults(schedule, args)` [none]: the arguments it takes from the schedule where
      hpo.pruner_args does not set them (a first rung at an evaluation step, warm-up steps).
    - `budget_defaults(worth, schedule)` [none]: the arguments it takes from the study's budget:
      `worth` is hpo.budget_trials (None under a count, hpo.n_trials); hpo.pruner_args wins.
    - `judges` [True]: False for one that never stops a trial (several objectives then get no
      pruning companion).
    - `pauses` [False]: a trial it stops is paused and resumed later from its run dir (the job
      must take training.resume); it then needs a `promoter`.
    - `compares_reports` [False]: True where it judges a trial by other trials' reports at the
      same step (median, percentile, a test against the best trial's reports): a warm start
      can then bring an earlier study's reports (hpo.warm_start.rungs); False where it reads
      only its own records (successive halving's rungs) or none.
    - `promoter(study, reports)` [None]: for one that pauses, what queues the paused trials
      that qualify now (asha's `Promoter`).
    """

    name: str
    build: Callable[[dict[str, object], ReportAxis | None], optuna.pruners.BasePruner]
    defaults: Defaults = no_defaults
    judges: bool = True
    pauses: bool = False
    compares_reports: bool = False
    promoter: Callable[[optuna.Study, optuna.Study], Promotes] | None = None
    budget_defaults: BudgetDefaults = lambda worth, schedule: {}


PRUNERS: Registry[PrunerKind] = Registry(__package__ or __name__, "hpo.pruner", private=True)


def pruner_kind(name: str) -> PrunerKind:
    """The registered pruner `name`, or one line naming the allowed ones."""
    try:
        return PRUNERS.get(name)
    except ConfigError as e:
        raise SweepConfigError(str(e)) from None


def pruners_comparing_reports() -> str:
    """The pruners a warm start's rungs serve, as a line names them (hpo.pruner=median or ...)."""
    return " or ".join(
        f"hpo.pruner={n}" for n in PRUNERS.names() if PRUNERS.get(n).compares_reports
    )


def pruner_defaults(
    name: str, schedule: ReportAxis | None, args: Mapping[str, object] | None = None
) -> dict[str, object]:
    """The arguments of pruner `name` that hpo.pruner_args (`args`) does not set."""
    return pruner_kind(name).defaults(schedule, args or {})


def study_pruner_args(
    name: str, args: Mapping[str, object], worth: float | None, schedule: ReportAxis | None
) -> dict[str, object]:
    """hpo.pruner_args over what pruner `name` takes from the study's budget (`worth`)."""
    return {**pruner_kind(name).budget_defaults(worth, schedule), **args}


def record_pruner_args(study: optuna.Study, args: Mapping[str, object]) -> None:
    if study.user_attrs.get(PRUNER_ARGS) != dict(args):
        study.set_user_attr(PRUNER_ARGS, dict(args))


def recorded_pruner_args(study: optuna.Study, fallback: Mapping[str, object]) -> dict[str, object]:
    """The pruner arguments the sweep recorded; `fallback` (the job's hpo.pruner_args) for a
    study no sweep of this version started."""
    recorded = study.user_attrs.get(PRUNER_ARGS)
    return dict(recorded) if isinstance(recorded, dict) else dict(fallback)


def build_pruner(
    name: str, args: Mapping[str, object], n_objectives: int, schedule: ReportAxis | None = None
) -> optuna.pruners.BasePruner:
    """The study's pruner. Several objectives: none here (Optuna cannot prune them); the
    pruning companion (`_companion.py`) gets this pruner built for one. No schedule: its rungs
    are placed once the study has learned a full trial's length (`LearnedAxisPruner`)."""
    kind = pruner_kind(name)
    if n_objectives > 1:
        return optuna.pruners.NopPruner()
    if schedule is None:
        place = functools.partial(_built, kind, args)
        return LearnedAxisPruner(place, placed="min_resource" in args)
    return _built(kind, args, schedule)


def _built(
    kind: PrunerKind, args: Mapping[str, object], schedule: ReportAxis | None
) -> optuna.pruners.BasePruner:
    try:
        return kind.build({**kind.defaults(schedule, args), **args}, schedule)
    except (TypeError, ValueError) as e:  # an unknown argument, or a value Optuna refuses
        raise SweepConfigError(
            f"hpo.pruner_args={dict(args)} do not fit hpo.pruner={kind.name}: {e}"
        ) from None


def first_rung(schedule: ReportAxis, fraction_of: int) -> int:
    """The first evaluation step at or after max_steps / fraction_of."""
    wanted = math.ceil(schedule.last / fraction_of)
    return max(schedule.every, math.ceil(wanted / schedule.every) * schedule.every)


def reduction_factor(args: Mapping[str, object]) -> int:
    """hpo.pruner_args.reduction_factor, checked here: the first rung is computed from it."""
    factor = args.get("reduction_factor", REDUCTION_FACTOR)
    if isinstance(factor, bool) or not isinstance(factor, int) or factor < 2:
        raise SweepConfigError(
            f"hpo.pruner_args.reduction_factor={factor!r} must be an integer >= 2"
        )
    return factor


def halving_defaults(schedule: ReportAxis | None, args: Mapping[str, object]) -> dict[str, object]:
    """Successive halving's (reduction factor r, 3 unless hpo.pruner_args sets it): the first
    rung at the first evaluation at or after max_steps / r**2, so a trial is judged twice before
    its end (at ~1/9 and ~1/3 of the run with r = 3). Step 0 is the untrained model, the same
    for every trial of one seed: never judged; judged at the first evaluation, the tiny CPU
    study lost its best trial, which starts slowly (docs/benchmarks.md, "HPO")."""
    factor = reduction_factor(args)
    if schedule is None:
        return {"reduction_factor": factor}
    return {"reduction_factor": factor, "min_resource": first_rung(schedule, factor**2)}
