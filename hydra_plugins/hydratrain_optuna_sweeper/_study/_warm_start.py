"""hpo.warm_start: a study that starts from what earlier studies learned.

Planned when the sweep is planned, before this study is opened: every source is opened and
read, its trials mapped into this search space, and anything wrong (a storage or study that
does not exist, a study with no finished trial, a space with nothing in common) is one line
with nothing written. Applied once per study, under the budget lock, by whichever worker gets
there first (a fleet's workers share what was borrowed; a rerun borrows nothing again):

- `enqueue`: each source's best `top_k` finished configurations run first, as trials of this
  study (no more than its budget holds), a near copy of one taken passed over for the next
  best; the default pruner judges them without its bootstrap (`_successive_halving.py`). A
  parameter this space lacks is dropped; a number outside its range is clipped to it; a choice
  it does not offer is left to the sampler; one line per such decision.
- `observe`: each source's finished trials are added as finished trials of this study, so the
  sampler learns from them at once. They are not run, not counted toward hpo.n_trials or
  hpo.budget_trials, never the study's best and never promoted (user attr reason=borrowed).
  Only a trial that lies in this space whole is observed (a value measured elsewhere, or
  without one of this space's parameters, would mislead a sampler that models them jointly).
  Their values are taken as they are, not by rank, and weighed as this study's own: TPE reads
  values only through their order, and measured with the new values shifted either way (a
  wider model, more data: docs/benchmarks.md) as-is met the warm start's goals on both. The
  sources must optimize the same directions, and their values compare only on the same task.
  `rungs` brings their reports too, for a pruner that compares reports (such as median) at
  equal data: only where their report axis and budget are this study's.

A trial a source borrowed itself is not borrowed again. The claim that makes it once per study
is a study of its own, `<study>:hpo:warm_start`, which only one worker can create (under the
budget lock on a journal; on a database the workers that lose wait until the winner has
added what it borrowed). A claim without the record of what was borrowed (a worker killed
while adding them) is said in a warning line; the sources are not read again.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import FrozenTrial, TrialState

from app.config.budget import ReportAxis
from app.config.hpo import WarmStartConfig
from app.studies.transfer import Parametrization

from .._errors import SweepConfigError
from .._private import contains, sampler_constraints, storage_of
from .._pruners._kind import pruner_kind
from .._pruners._learned import BORROWED, BUDGET, UNIT
from .._pruners._lineage import BORROWED_FROM, UNCOUNTED
from ._best import own_front
from ._samplers import OOM, TRIAL_CONSTRAINTS
from ._settings import SweepSettings
from ._shared import budget_lock
from ._storage import Masker, StorageSpec, open_storage
from ._warm_sources import KEY, check_settings, open_source, storage_exists

log = logging.getLogger(__name__)

WAIT_S = 60.0  # how long a worker waits for another's borrowed trials to appear
# Two borrowed configurations this close on every parameter (a fraction of its range) are one:
# a study's best few often are near copies of each other (TPE samples around its best).
NEAR = 0.05
FROM = BORROWED_FROM  # user attr: "<study>#<trial number>" a trial was borrowed from
RECORD = "hpo:warm_start"  # study user attr: what was borrowed, written once


@dataclass(frozen=True)
class Target:
    """This study, as the warm start maps into it: its search space and directions, its report
    axis, whether its pruner compares reports, whether its trials carry the OOM constraint, and
    the trials its budget holds."""

    space: dict[str, BaseDistribution]
    directions: list[str]
    schedule: ReportAxis | None = None
    compares_reports: bool = False
    constraints: bool = False
    cap: int = 20
    parametrization: Parametrization = field(default_factory=Parametrization)


@dataclass
class Borrowed:
    """What a study takes from earlier ones, mapped into its space, ready to apply."""

    take: str
    sources: list[str]  # "study 'a' in <storage>", one per source, masked
    enqueued: list[tuple[dict[str, object], str]] = field(default_factory=list)  # params, from
    observed: list[FrozenTrial] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # one line per mapping decision

    def describe(self) -> str:
        taken = (
            f"{len(self.enqueued)} configurations enqueued to run first"
            if self.take == "enqueue"
            else f"{len(self.observed)} finished trials observed (not run, not counted)"
        )
        return f"warm start from {'; '.join(self.sources)}: {taken}"

    def record(self) -> dict[str, object]:
        return {
            "studies": self.sources,
            "take": self.take,
            "enqueued": len(self.enqueued),
            "observed": len(self.observed),
        }


def plan_warm_start(cfg: WarmStartConfig, target: Target, mask: Masker) -> Borrowed | None:
    """The borrowed trials, or None for a cold start; one line for anything wrong."""
    if not cfg.studies:
        return None
    check_settings(cfg, len(target.directions), target.compares_reports)
    borrowed = Borrowed(cfg.take, [])
    for i, entry in enumerate(cfg.studies):
        key = f"{KEY}.studies[{i}]"
        study, label = open_source(entry, key, mask)
        borrowed.sources.append(label)
        _check_parametrization(study, target.parametrization, cfg, key, label)
        done = [
            t
            for t in study.get_trials(deepcopy=False)
            if t.state == TrialState.COMPLETE and not is_borrowed(t)
        ]
        if not done:
            raise SweepConfigError(f"{key}: {label} has no finished trial to start from")
        searched = sorted({name for t in done for name in t.params})
        if not set(target.space) & set(searched):
            raise SweepConfigError(
                f"{key}: {label} searched {', '.join(searched)}, nothing of this search space "
                f"({', '.join(sorted(target.space))})"
            )
        if cfg.take == "enqueue":
            _enqueue_best(borrowed, done, study, cfg.top_k, target)
        else:
            _check_comparable(study, target, cfg.rungs, key, label)
            _observe(borrowed, done, study.study_name, cfg.rungs, target)
    return borrowed


def warm_start_for(
    s: SweepSettings,
    space: dict[str, BaseDistribution],
    schedule: ReportAxis | None,
    constraints: bool,
    mask: Masker,
) -> Borrowed | None:
    """hpo.warm_start of the sweep's settings, read and mapped into this space before this
    study is touched; None for a cold start or a study warm-started already."""
    if s.warm_start is None or not s.warm_start.studies:
        return None
    check_settings(s.warm_start, len(s.directions))
    if already_borrowed(s.storage, s.study_name, mask):
        log.info("warm start: done in an earlier run of study %s", s.study_name)
        return None
    b = s.budget
    target = Target(
        space=space,
        directions=[d or "minimize" for d in s.directions],
        schedule=schedule,
        compares_reports=pruner_kind(s.pruner).compares_reports,
        constraints=constraints,
        cap=max(0, (b.n_trials or max(1, math.floor(b.worth or 1))) - len(s.enqueue)),
        parametrization=s.parametrization,
    )
    warm = plan_warm_start(s.warm_start, target, mask)
    if warm is not None:
        log.info("%s", warm.describe())
        for note in warm.notes:
            log.info("warm start: %s", note)
    return warm


def claim(study_name: str) -> str:
    """The study whose creation claims the warm start of `study_name`."""
    return f"{study_name}:hpo:warm_start"


def already_borrowed(spec: StorageSpec, study_name: str | None, mask: Masker) -> bool:
    """This study was warm-started in an earlier run (a rerun, or another worker's): its
    sources are not read again. A journal file or SQLite database that is not there is not
    opened (that would create it); a database server's storage is opened, as the sweep will."""
    if spec.kind == "memory" or study_name is None or not storage_exists(spec):
        return False
    storage = open_storage(spec, mask)
    if claim(study_name) not in optuna.get_all_study_names(storage):
        return False
    study = optuna.load_study(study_name=study_name, storage=storage)
    if RECORD not in study.user_attrs:
        log.warning(
            "warm start: study %s was claimed but what it borrowed was never recorded (a worker "
            "killed while adding it?): going on with what it holds",
            study_name,
        )
    return True


def apply_warm_start(study: optuna.Study, borrowed: Borrowed, lock_path: str | None) -> bool:
    """Enqueue or add what was borrowed, once per study (whoever creates the claim first);
    False where another worker or an earlier run did, once what it borrowed is in."""
    with budget_lock(lock_path):
        try:
            optuna.create_study(study_name=claim(study.study_name), storage=storage_of(study))
        except optuna.exceptions.DuplicatedStudyError:
            _wait_for_record(study)
            return False
        for params, source in borrowed.enqueued:
            study.enqueue_trial(params, user_attrs={FROM: source})
        for trial in borrowed.observed:
            study.add_trial(trial)
        study.set_user_attr(RECORD, borrowed.record())
    return True


def _wait_for_record(study: optuna.Study, timeout_s: float = WAIT_S) -> None:
    """On a database another worker may be adding the borrowed trials right now: a first
    trial asked before they are in would be drawn cold."""
    deadline = time.monotonic() + timeout_s
    while RECORD not in study.user_attrs:
        if time.monotonic() > deadline:
            log.warning("warm start: another worker claimed it and added nothing in %g s", WAIT_S)
            return
        time.sleep(0.5)


def is_borrowed(t: FrozenTrial) -> bool:
    return t.user_attrs.get("reason") == BORROWED


def _enqueue_best(
    borrowed: Borrowed, done: list[FrozenTrial], study: optuna.Study, top_k: int, target: Target
) -> None:
    """The best `top_k` configurations that are not near copies of one taken already (a near
    copy is passed over for the next best, with a line), within the budget's cap."""
    taken = 0
    for t in _best(done, study):
        source = f"{study.study_name}#{t.number}"
        params, notes = _mapped(t.params, target.space, source)
        if taken == top_k or not params:
            continue
        twin = next((f for p, f in borrowed.enqueued if _near(p, params, target.space)), None)
        if twin is not None:
            borrowed.notes.append(f"{source}: not enqueued, a near copy of {twin}")
            continue
        taken += 1
        if len(borrowed.enqueued) >= target.cap:
            borrowed.notes.append(f"{source}: not enqueued, the budget holds {target.cap} trials")
            continue
        borrowed.notes += notes
        borrowed.enqueued.append((params, source))


def _near(a: dict[str, object], b: dict[str, object], space: dict[str, BaseDistribution]) -> bool:
    """The same parameters, each choice the same and each number within NEAR of its range
    (on a log range: of its decades) of the other's: running both would tell little more."""
    if a.keys() != b.keys():
        return False
    return all(_gap(a[k], b[k], space[k]) <= NEAR for k in a)


def _gap(x: object, y: object, dist: BaseDistribution) -> float:
    """How far apart two values of `dist` are, as a fraction of its range (1: unrelated)."""
    if not isinstance(dist, FloatDistribution | IntDistribution):
        return 0.0 if x == y else 1.0
    low, high, u, v = float(dist.low), float(dist.high), float(x), float(y)  # type: ignore[arg-type]
    if dist.log:
        low, high, u, v = (math.log(max(z, 1e-300)) for z in (low, high, u, v))
    return abs(u - v) / (high - low) if high > low else 0.0


def _best(done: list[FrozenTrial], study: optuna.Study) -> list[FrozenTrial]:
    """Best first: by value, or for several objectives the Pareto front first."""
    if len(study.directions) == 1:
        sign = -1.0 if study.direction == optuna.study.StudyDirection.MAXIMIZE else 1.0
        return sorted(done, key=lambda t: sign * float(t.value))  # type: ignore[arg-type]
    front = {t.number for t in own_front(study, done)}
    return sorted(done, key=lambda t: (t.number not in front, t.number))


def _mapped(
    params: dict[str, object], space: dict[str, BaseDistribution], source: str
) -> tuple[dict[str, object], list[str]]:
    """`params` in this space: clipped into a range, a missing choice left to the sampler."""
    out: dict[str, object] = {}
    notes = [f"{source}: {k} is not searched here, dropped" for k in params if k not in space]
    for k, dist in space.items():
        if k not in params:
            continue
        value, note = _fit(params[k], dist)
        if note:
            notes.append(f"{source}: {k}={params[k]!r} {note}")
        if value is not None:
            out[k] = value
    return out, notes


def _fit(value: object, dist: BaseDistribution) -> tuple[object | None, str | None]:
    """`value` in `dist`: as it is where Optuna finds it inside, else clipped into the range and
    onto its grid (a rounding's worth away: no line), or None where no number can stand in."""
    if contains(dist, value):
        return value, None
    if isinstance(dist, CategoricalDistribution):
        return None, "is not a choice here: left to the sampler"
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None, "is not a number: left to the sampler"
    assert isinstance(dist, FloatDistribution | IntDistribution)
    fitted: float = min(max(float(value), dist.low), dist.high)
    if dist.step is not None and not dist.log:
        fitted = dist.low + round((fitted - dist.low) / dist.step) * dist.step
        fitted = min(fitted, dist.high)
    out: int | float = round(fitted) if isinstance(dist, IntDistribution) else fitted
    if not contains(dist, out):
        return None, "does not fit this range: left to the sampler"
    close = math.isclose(out, float(value), rel_tol=1e-9, abs_tol=1e-12)
    return out, None if close else f"clipped to {out!r}"


def _check_parametrization(
    source: optuna.Study, here: Parametrization, cfg: WarmStartConfig, key: str, label: str
) -> None:
    """Values carry over as they are between studies of one parametrization (a μP proxy's into
    a μP target's, at one base width); across them, only where asked."""
    why = here.mismatch(Parametrization.of(source.user_attrs))
    if why and not cfg.across_parametrizations:
        raise SweepConfigError(
            f"{key}: {label} {why}: its values (the learning rate above all) mean other rates "
            f"here; set {KEY}.across_parametrizations=true to take them anyway"
        )


def _check_comparable(
    study: optuna.Study, target: Target, rungs: bool, key: str, label: str
) -> None:
    theirs = [d.name.lower() for d in study.directions]
    if theirs != list(target.directions):
        raise SweepConfigError(
            f"{key}: {label} {'/'.join(theirs)}s, this study {'/'.join(target.directions)}s: "
            "its values cannot be observed here (take=enqueue borrows its configurations)"
        )
    if not rungs:
        return
    axis = (study.user_attrs.get(UNIT), study.user_attrs.get(BUDGET))
    schedule = target.schedule
    here = (schedule.unit, schedule.last) if schedule is not None else (None, None)
    if axis != here:
        raise SweepConfigError(
            f"{KEY}.rungs: {label} reported in {axis[0]} up to {axis[1]}, this study in "
            f"{here[0]} up to {here[1]}: its reports are not at equal data; set rungs=false"
        )


def _inside(value: object, dist: BaseDistribution) -> bool:
    """`value` lies in `dist` as it is, or a rounding's worth away from its grid."""
    fitted, note = _fit(value, dist)
    return note is None and fitted is not None


def _observe(
    borrowed: Borrowed, done: list[FrozenTrial], name: str, rungs: bool, target: Target
) -> None:
    space, left_out = target.space, 0
    for t in done:
        if not all(k in t.params and _inside(t.params[k], d) for k, d in space.items()):
            left_out += 1
            continue
        params = {k: _fit(t.params[k], d)[0] for k, d in space.items()}
        trial = optuna.trial.create_trial(
            params=params,
            distributions=dict(space),
            values=list(t.values),
            intermediate_values=dict(t.intermediate_values) if rungs else None,
            user_attrs={"reason": BORROWED, FROM: f"{name}#{t.number}"},
            system_attrs={UNCOUNTED: True, **_old_constraints(target)},
        )
        if target.constraints and TRIAL_CONSTRAINTS:
            trial.set_constraint(OOM, 0.0)  # it finished: it fit
        borrowed.observed.append(trial)
    if left_out:
        borrowed.notes.append(
            f"{name}: {left_out} finished trials not observed: outside this space, or without "
            "one of its parameters"
        )


def _old_constraints(target: Target) -> dict[str, object]:
    """Optuna 4.x keeps the OOM constraint where the sampler's constraints_func wrote it."""
    if not target.constraints or TRIAL_CONSTRAINTS:
        return {}
    return sampler_constraints([0.0])
