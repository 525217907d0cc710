"""hpo.warm_start: a study that starts from what earlier studies learned.

Planned when the sweep is planned, before this study is opened: every source is opened and
read, its trials mapped into this search space, and anything wrong (a storage or study that
does not exist, a study with no finished trial, a space with nothing in common) is one line
with nothing written. Applied once per study, under the budget lock, by whichever worker gets
there first (a fleet's workers share what was borrowed; a rerun borrows nothing again):

- `enqueue`: each source's best `top_k` finished configurations run first, as trials of this
  study. A parameter this space lacks is dropped; a number outside its range is clipped to it;
  a choice it does not offer is left to the sampler; one line per such decision.
- `observe`: each source's finished trials are added as finished trials of this study, so the
  sampler learns from them at once. They are not run, not counted toward hpo.n_trials or
  hpo.budget_trials, never the study's best and never promoted (user attr reason=borrowed). A
  trial with a parameter outside this space is not observed (its value was measured elsewhere).
  Their values are taken as they are: the sources must optimize the same directions, and their
  values are comparable only on the same task. `rungs` brings their reports too, for the pruner
  to compare at equal data: only where their report axis and budget are this study's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import yaml
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import FrozenTrial, TrialState

from app.hpo import ReportAxis, WarmStartConfig

from .._errors import SweepConfigError, first_line
from .._pruners._lineage import UNCOUNTED
from ._cost import BORROWED
from ._samplers import OOM, TRIAL_CONSTRAINTS
from ._shared import BUDGET, UNIT, budget_lock
from ._storage import JOURNAL_NAME, Masker, StorageSpec, open_storage, storage_spec

KEY = "hpo.warm_start"
TAKES = ("enqueue", "observe")
FROM = "warm_start_from"  # user attr: "<study>#<trial number>" a trial was borrowed from
RECORD = "hpo:warm_start"  # study user attr: what was borrowed, written once


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


def plan_warm_start(
    cfg: WarmStartConfig,
    space: dict[str, BaseDistribution],
    directions: list[str],
    schedule: ReportAxis | None,
    mask: Masker,
) -> Borrowed | None:
    """The borrowed trials, or None for a cold start; one line for anything wrong."""
    if not cfg.studies:
        return None
    _check_settings(cfg)
    borrowed = Borrowed(cfg.take, [])
    for i, entry in enumerate(cfg.studies):
        key = f"{KEY}.studies[{i}]"
        study, label = _open(entry, key, mask)
        borrowed.sources.append(label)
        done = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
        if not done:
            raise SweepConfigError(f"{key}: {label} has no finished trial to start from")
        if not set(space) & {name for t in done for name in t.params}:
            raise SweepConfigError(
                f"{key}: {label} searched {', '.join(sorted(done[0].params))}, nothing of this "
                f"search space ({', '.join(sorted(space))})"
            )
        name = study.study_name
        if cfg.take == "enqueue":
            _enqueue_best(borrowed, done, study, cfg.top_k, space, name)
        else:
            _check_comparable(study, directions, schedule, cfg.rungs, key, label)
            _observe(borrowed, done, space, name, cfg.rungs)
    return borrowed


def apply_warm_start(study: optuna.Study, borrowed: Borrowed, lock_path: str | None) -> bool:
    """Enqueue or add what was borrowed, once per study; False where it was done already."""
    with budget_lock(lock_path):
        if study.user_attrs.get(RECORD):
            return False
        for params, source in borrowed.enqueued:
            study.enqueue_trial(params, user_attrs={FROM: source})
        for trial in borrowed.observed:
            study.add_trial(trial)
        study.set_user_attr(RECORD, borrowed.record())
    return True


def is_borrowed(t: FrozenTrial) -> bool:
    return t.user_attrs.get("reason") == BORROWED


def _check_settings(cfg: WarmStartConfig) -> None:
    if cfg.take not in TAKES:
        raise SweepConfigError(
            f"{KEY}.take={cfg.take!r} is not allowed; choose one of: {', '.join(TAKES)}"
        )
    if isinstance(cfg.top_k, bool) or not isinstance(cfg.top_k, int) or cfg.top_k < 1:
        raise SweepConfigError(f"{KEY}.top_k={cfg.top_k!r} must be an integer >= 1")
    if cfg.rungs and cfg.take != "observe":
        raise SweepConfigError(f"{KEY}.rungs=true brings observed reports: needs take=observe")


def _open(entry: object, key: str, mask: Masker) -> tuple[optuna.Study, str]:
    """The source study and how lines name it."""
    spec, name = _source(entry, key)
    label = f"study {name!r} in {mask(spec.text)}"
    if spec.kind == "journal" and not Path(str(spec.target)).is_file():
        raise SweepConfigError(f"{key}: no study storage at {spec.target}")
    try:
        storage = open_storage(spec, mask)
        return optuna.load_study(study_name=name, storage=storage), label
    except KeyError:
        known = optuna.get_all_study_names(storage)
        raise SweepConfigError(
            f"{key}: no study {name!r} in {mask(spec.text)}; it holds: {', '.join(known) or 'none'}"
        ) from None
    except SweepConfigError:
        raise
    except Exception as e:  # an unreachable database, a file that is not a journal
        raise SweepConfigError(f"{key}: {label} cannot be read: {mask(first_line(e))}") from None


def _source(entry: object, key: str) -> tuple[StorageSpec, str]:
    """(storage, study name) of one source: {storage, study_name} or {sweep_dir}."""
    if not isinstance(entry, dict):
        raise SweepConfigError(
            f"{key}={entry!r}: give {{storage: PATH_OR_URL, study_name: NAME}} or "
            "{sweep_dir: DIR}"
        )
    unknown = sorted(set(entry) - {"storage", "study_name", "sweep_dir"})
    if unknown:
        raise SweepConfigError(
            f"{key}.{unknown[0]}: no such key; known: storage, study_name, sweep_dir"
        )
    if "sweep_dir" in entry:
        return _from_sweep_dir(Path(str(entry["sweep_dir"])), key)
    if not entry.get("storage") or not entry.get("study_name"):
        raise SweepConfigError(f"{key}: needs both storage and study_name (or a sweep_dir)")
    spec = storage_spec(entry["storage"], f"{key}.storage", ".", null_is_memory=False)
    if spec.kind == "memory":
        raise SweepConfigError(f"{key}.storage: a study in memory ended with its sweep")
    return spec, str(entry["study_name"])


def _from_sweep_dir(sweep_dir: Path, key: str) -> tuple[StorageSpec, str]:
    results = sweep_dir / "optimization_results.yaml"
    if not results.is_file():
        raise SweepConfigError(f"{key}.sweep_dir: no {results.name} in {sweep_dir}")
    data = yaml.safe_load(results.read_text()) or {}
    name = data.get("study_name")
    journal = sweep_dir / JOURNAL_NAME
    if not name:
        raise SweepConfigError(f"{key}.sweep_dir: {results} names no study")
    if not journal.is_file():
        raise SweepConfigError(
            f"{key}.sweep_dir: its study is not in {journal}; give storage and study_name"
        )
    return StorageSpec("journal", str(journal.absolute()), f"{key}.sweep_dir"), str(name)


def _enqueue_best(
    borrowed: Borrowed,
    done: list[FrozenTrial],
    study: optuna.Study,
    top_k: int,
    space: dict[str, BaseDistribution],
    name: str,
) -> None:
    for t in _best(done, study)[:top_k]:
        params, notes = _mapped(t.params, space, f"{name}#{t.number}")
        borrowed.notes += notes
        if params and params not in [p for p, _ in borrowed.enqueued]:
            borrowed.enqueued.append((params, f"{name}#{t.number}"))


def _best(done: list[FrozenTrial], study: optuna.Study) -> list[FrozenTrial]:
    """Best first: by value, or for several objectives the Pareto front first."""
    if len(study.directions) == 1:
        sign = -1.0 if study.direction == optuna.study.StudyDirection.MAXIMIZE else 1.0
        return sorted(done, key=lambda t: sign * float(t.value))  # type: ignore[arg-type]
    front = {t.number for t in study.best_trials}
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
    if isinstance(dist, CategoricalDistribution):
        if value in dist.choices:
            return value, None
        return None, "is not a choice here: left to the sampler"
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None, "is not a number: left to the sampler"
    assert isinstance(dist, FloatDistribution | IntDistribution)
    fitted: float = min(max(float(value), dist.low), dist.high)
    if dist.step is not None and not dist.log:
        fitted = dist.low + round((fitted - dist.low) / dist.step) * dist.step
        fitted = min(fitted, dist.high)
    out: int | float = round(fitted) if isinstance(dist, IntDistribution) else fitted
    return out, None if math.isclose(out, float(value)) else f"clipped to {out!r}"


def _check_comparable(
    study: optuna.Study,
    directions: list[str],
    schedule: ReportAxis | None,
    rungs: bool,
    key: str,
    label: str,
) -> None:
    theirs = [d.name.lower() for d in study.directions]
    if theirs != list(directions):
        raise SweepConfigError(
            f"{key}: {label} {'/'.join(theirs)}s, this study {'/'.join(directions)}s: "
            "its values cannot be observed here (take=enqueue borrows its configurations)"
        )
    if not rungs:
        return
    axis = (study.user_attrs.get(UNIT), study.user_attrs.get(BUDGET))
    here = (schedule.unit, schedule.last) if schedule is not None else (None, None)
    if axis != here:
        raise SweepConfigError(
            f"{KEY}.rungs: {label} reported in {axis[0]} up to {axis[1]}, this study in "
            f"{here[0]} up to {here[1]}: its reports are not at equal data; set rungs=false"
        )


def _observe(
    borrowed: Borrowed,
    done: list[FrozenTrial],
    space: dict[str, BaseDistribution],
    name: str,
    rungs: bool,
) -> None:
    outside = 0
    for t in done:
        params = {k: v for k, v in t.params.items() if k in space}
        if not params:
            continue
        if any(_fit(v, space[k]) != (v, None) for k, v in params.items()):
            outside += 1
            continue
        trial = optuna.trial.create_trial(
            params=params,
            distributions={k: space[k] for k in params},
            values=list(t.values),
            intermediate_values=dict(t.intermediate_values) if rungs else None,
            user_attrs={"reason": BORROWED, FROM: f"{name}#{t.number}"},
            system_attrs={UNCOUNTED: True},
        )
        for constraint, value in _constraints(t).items():
            trial.set_constraint(constraint, value)
        borrowed.observed.append(trial)
    if outside:
        borrowed.notes.append(f"{name}: {outside} finished trials lie outside this space")


def _constraints(t: FrozenTrial) -> dict[str, float]:
    """Where this study's trials carry the OOM constraint (Optuna >= 5), a borrowed one does
    too (a sampler that reads constraints wants them on every trial): its own, or feasible (it
    finished)."""
    if not TRIAL_CONSTRAINTS:
        return {}
    own: dict[str, float] = dict(getattr(t, "constraints", None) or {})
    return own or {OOM: 0.0}
