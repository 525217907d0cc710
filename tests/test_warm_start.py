"""hpo.warm_start: a study started from earlier ones. Its trials mapped into a changed space,
enqueued to run first or observed (shown to the sampler, not run, not counted), once per
study; and every bad source is one line before anything is written."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from app.config.budget import ReportAxis
from app.config.hpo import WarmStartConfig
from hydra_plugins.hydratrain_optuna_sweeper._errors import SweepConfigError
from hydra_plugins.hydratrain_optuna_sweeper._pruners._kind import PRUNERS, PrunerKind
from hydra_plugins.hydratrain_optuna_sweeper._pruners._learned import BUDGET, UNIT
from hydra_plugins.hydratrain_optuna_sweeper._study._cost import trials_worth
from hydra_plugins.hydratrain_optuna_sweeper._study._shared import count_toward_budget, requeue
from hydra_plugins.hydratrain_optuna_sweeper._study._storage import Masker, StorageSpec, journal
from hydra_plugins.hydratrain_optuna_sweeper._study._warm_start import (
    FROM,
    RECORD,
    Target,
    _mapped,
    _near,
    already_borrowed,
    apply_warm_start,
    is_borrowed,
    plan_warm_start,
)
from tests.own_sweep import sweep_own_app

pytestmark = pytest.mark.unit

SPACE = {
    "x": FloatDistribution(-8.0, 8.0),
    "n": IntDistribution(1, 9, step=2),
    "kind": CategoricalDistribution(["a", "b"]),
}
MASK = Masker.of([])


def _source(tmp_path: Path, name: str = "old", n: int = 6, direction: str = "minimize") -> str:
    """A finished study in a journal file: x = 0..n-1, value (x - 2)^2; its path."""
    path = str(tmp_path / f"{name}.journal")
    study = optuna.create_study(study_name=name, storage=journal(path), direction=direction)
    for i in range(n):
        trial = optuna.trial.create_trial(
            params={"x": float(i), "n": 3, "kind": "a", "gone": 1.0},
            distributions={
                "x": FloatDistribution(-10.0, 10.0),
                "n": IntDistribution(1, 9, step=2),
                "kind": CategoricalDistribution(["a", "c"]),
                "gone": FloatDistribution(0.0, 2.0),
            },
            value=(i - 2.0) ** 2,
            intermediate_values={10: (i - 2.0) ** 2 + 1.0},
        )
        study.add_trial(trial)
    study.set_user_attr(UNIT, "samples")
    study.set_user_attr(BUDGET, 100)
    return path


def _warm(path: str, **settings) -> WarmStartConfig:
    return WarmStartConfig(studies=[{"storage": path, "study_name": "old"}], **settings)


def _plan(cfg: WarmStartConfig, directions=("minimize",), schedule=None, **target):
    """Planned for a study of SPACE whose pruner compares reports (median)."""
    aim = Target(dict(SPACE), list(directions), schedule, compares_reports=True, **target)
    return plan_warm_start(cfg, aim, MASK)


def test_a_configuration_maps_into_a_changed_space_with_a_line_per_decision():
    params = {"x": 12.5, "n": 4, "kind": "c", "gone": 1.0}
    mapped, notes = _mapped(params, SPACE, "old#3")
    assert mapped == {"x": 8.0, "n": 5}  # clipped; snapped to the step; the choice left out
    assert notes == [
        "old#3: gone is not searched here, dropped",
        "old#3: x=12.5 clipped to 8.0",
        "old#3: n=4 clipped to 5",
        "old#3: kind='c' is not a choice here: left to the sampler",
    ]
    assert _mapped({"x": 1.0, "n": 3, "kind": "b"}, SPACE, "s")[1] == []  # inside: no line


def test_enqueue_runs_the_best_configurations_first_once_per_study(tmp_path):
    warm = _plan(_warm(_source(tmp_path), top_k=3))
    assert warm is not None
    assert [p["x"] for p, _ in warm.enqueued] == [2.0, 1.0, 3.0]  # best first
    study = optuna.create_study(study_name="new", storage=journal(str(tmp_path / "new.journal")))
    assert apply_warm_start(study, warm, str(tmp_path / "lock"))
    assert not apply_warm_start(study, warm, None)  # a rerun, another worker: claimed
    spec = StorageSpec("journal", str(tmp_path / "new.journal"), "hpo.storage")
    assert already_borrowed(spec, "new", MASK) and not already_borrowed(spec, "other", MASK)
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert [t.user_attrs[FROM] for t in waiting] == ["old#2", "old#1", "old#3"]
    assert study.user_attrs[RECORD]["enqueued"] == 3
    first = study.ask()  # "kind" ('a' is no choice here) is left to the sampler
    assert (first.suggest_float("x", -8, 8), first.suggest_int("n", 1, 9, step=2)) == (2.0, 3)


def test_observed_trials_are_shown_to_the_sampler_but_not_counted(tmp_path):
    warm = _plan(_warm(_source(tmp_path), take="observe"))
    assert warm is not None and len(warm.observed) == 6
    study = optuna.create_study(study_name="new", storage=journal(str(tmp_path / "new.journal")))
    apply_warm_start(study, warm, None)
    trials = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(trials) == 6 and all(is_borrowed(t) for t in trials)
    assert count_toward_budget(trials) == 0  # not toward hpo.n_trials
    assert trials_worth(trials, last=100) == 0.0  # nor hpo.budget_trials
    assert all(t.intermediate_values == {} for t in trials)  # rungs: only when asked
    assert {t.params["x"] for t in trials} == {0.0, 1.0, 2.0, 3.0, 4.0, 5.0}


def test_observe_brings_the_reports_only_at_equal_data(tmp_path):
    path = _source(tmp_path)
    same = ReportAxis(every=10, last=100, unit="samples")
    warm = _plan(_warm(path, take="observe", rungs=True), schedule=same)
    assert warm is not None and warm.observed[0].intermediate_values == {10: 5.0}
    other = ReportAxis(every=10, last=300, unit="steps")
    with pytest.raises(
        SweepConfigError, match="reported in samples up to 100, this study in steps"
    ):
        _plan(_warm(path, take="observe", rungs=True), schedule=other)


def test_observe_takes_a_grid_value_as_it_is_and_only_trials_that_fit_this_space_whole(tmp_path):
    path = str(tmp_path / "grid.journal")
    study = optuna.create_study(study_name="old", storage=journal(path))
    grid = {"drop": FloatDistribution(0.1, 0.9, step=0.1)}
    for value in (0.3, 0.7):  # 0.3 snaps to 0.30000000000000004 on the grid: still inside
        study.add_trial(
            optuna.trial.create_trial(params={"drop": value}, distributions=grid, value=1.0)
        )
    cfg = _warm(path, take="observe")
    warm = plan_warm_start(cfg, Target(dict(grid), ["minimize"]), MASK)
    assert warm is not None and [t.params["drop"] for t in warm.observed] == [0.3, 0.7]
    wider = {**grid, "y": FloatDistribution(0.0, 1.0)}  # a parameter the source never searched
    warm = plan_warm_start(cfg, Target(wider, ["minimize"]), MASK)
    assert warm is not None and warm.observed == []
    assert warm.notes == [
        "old: 2 finished trials not observed: outside this space, or without one of its parameters"
    ]


def test_enqueue_stops_at_the_budget_and_skips_what_a_source_borrowed_itself(tmp_path):
    path = _source(tmp_path)
    study = optuna.load_study(study_name="old", storage=journal(path))
    borrowed = optuna.trial.create_trial(
        params={"x": 2.5}, distributions={"x": FloatDistribution(-10.0, 10.0)}, value=-1.0,
        user_attrs={"reason": "borrowed"},
    )  # fmt: skip
    study.add_trial(borrowed)  # the best value of all, but not this source's own
    warm = _plan(_warm(path, top_k=5), cap=2)
    assert warm is not None and [p["x"] for p, _ in warm.enqueued] == [2.0, 1.0]
    assert warm.notes[-3:] == [
        f"old#{n}: not enqueued, the budget holds 2 trials" for n in (3, 0, 4)
    ]


def test_near_copies_among_the_best_are_passed_over_for_the_next_best(tmp_path):
    """A study's best few are often near copies (TPE samples around its best): top_k counts
    configurations that are apart, each one passed over said in a line."""
    path = str(tmp_path / "old.journal")
    study = optuna.create_study(study_name="old", storage=journal(path))
    for x in (2.0, 2.4, 5.0, 0.0):  # 2.4 is 0.4 from 2.0: 2.5 % of x's range here (16)
        study.add_trial(
            optuna.trial.create_trial(
                params={"x": x}, distributions={"x": SPACE["x"]}, value=(x - 2.0) ** 2
            )
        )
    warm = _plan(_warm(path, top_k=2))
    assert warm is not None and [p["x"] for p, _ in warm.enqueued] == [2.0, 0.0]
    assert warm.notes == ["old#1: not enqueued, a near copy of old#0"]
    lr = {"lr": FloatDistribution(1e-5, 1e-1, log=True)}  # a log range: by its decades
    assert _near({"lr": 1e-3}, {"lr": 1.2e-3}, lr) and not _near({"lr": 1e-3}, {"lr": 2e-3}, lr)
    assert not _near({"x": 2.0, "kind": "a"}, {"x": 2.0, "kind": "b"}, SPACE)


def test_a_borrowed_configuration_keeps_its_mark_when_it_is_queued_again(tmp_path):
    """A preempted or stale borrowed trial is re-queued: the copy is still judged as borrowed
    (the default pruner's bootstrap does not take it)."""
    study = optuna.create_study(study_name="new", storage=journal(str(tmp_path / "j")))
    study.enqueue_trial({"x": 1.0}, user_attrs={FROM: "old#2"})
    trial = study.ask({"x": SPACE["x"]})
    requeue(study, study.trials[trial.number], {"resume_from": "run"})
    copy = study.get_trials(states=(TrialState.WAITING,))[0]
    assert copy.user_attrs == {FROM: "old#2", "resume_from": "run"}


def test_rungs_only_for_a_pruner_that_compares_reports(tmp_path, monkeypatch):
    """The line names the pruners that do, as their kinds say: one registered here is named."""
    PRUNERS.names()  # the project's own first
    monkeypatch.setitem(PRUNERS._items, "peers", PrunerKind("peers", build=_no_pruner))
    monkeypatch.setitem(
        PRUNERS._items, "rivals", PrunerKind("rivals", build=_no_pruner, compares_reports=True)
    )
    cfg = _warm(_source(tmp_path), take="observe", rungs=True)
    aim = Target(dict(SPACE), ["minimize"], ReportAxis(10, 100, "samples"))
    with pytest.raises(SweepConfigError, match="does not compare reports at a step") as err:
        plan_warm_start(cfg, aim, MASK)
    comparing = [n for n in PRUNERS.names() if PRUNERS.get(n).compares_reports]
    assert "rivals" in comparing and "peers" not in comparing and "median" in comparing
    assert f"({' or '.join(f'hpo.pruner={n}' for n in comparing)} does," in str(err.value)


def _no_pruner(args: dict[str, object], schedule: ReportAxis | None) -> optuna.pruners.BasePruner:
    return optuna.pruners.NopPruner()


def test_a_value_a_rounding_away_from_this_space_is_taken_where_optuna_takes_it(tmp_path):
    """An int searched as a float before, a float a hair past the range: mapped to the value
    Optuna's own check accepts (a traceback from create_trial, or 2.9999999999 truncated to 2
    by suggest_int, before)."""
    space = {"n": IntDistribution(1, 10), "p": FloatDistribution(0.0, 0.1)}
    assert _mapped({"n": 2.9999999999, "p": 0.1 + 1e-12}, space, "s") == ({"n": 3, "p": 0.1}, [])
    path = str(tmp_path / "float.journal")
    study = optuna.create_study(study_name="old", storage=journal(path))
    dist = {"n": FloatDistribution(0.0, 20.0), "p": FloatDistribution(0.0, 1.0)}
    for n in (3.0000000001, 7.5):
        study.add_trial(
            optuna.trial.create_trial(params={"n": n, "p": 0.05}, distributions=dist, value=n)
        )
    warm = plan_warm_start(_warm(path, take="observe"), Target(space, ["minimize"]), MASK)
    assert warm is not None and [t.params for t in warm.observed] == [{"n": 3, "p": 0.05}]


def test_a_rerun_of_a_study_on_a_missing_sqlite_file_creates_nothing(tmp_path):
    spec = StorageSpec("url", f"sqlite:///{tmp_path}/study.db", "hpo.storage")
    assert not already_borrowed(spec, "s", MASK)
    assert list(tmp_path.iterdir()) == []


def _bad_results(where: Path, text: str) -> WarmStartConfig:
    (where / "sweep").mkdir(exist_ok=True)
    (where / "sweep" / "optimization_results.yaml").write_text(text)
    return WarmStartConfig([{"sweep_dir": str(where / "sweep")}])


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda p: _warm(str(p / "nowhere.journal")), "no study storage at"),
        (lambda p: WarmStartConfig([{"storage": _source(p), "study_name": "x"}]), "it holds: old"),
        (lambda p: _warm(_source(p, n=0)), "has no finished trial"),
        (lambda p: _warm(_source(p), take="borrow"), "take='borrow' is not allowed"),
        (lambda p: _warm(_source(p), top_k=0), "top_k=0 must be an integer >= 1"),
        (lambda p: _warm(_source(p), rungs=True), "needs take=observe"),
        (lambda p: WarmStartConfig([{"sweep_dir": str(p)}]), "no optimization_results.yaml"),
        (lambda p: WarmStartConfig(["old"]), "give {storage: PATH_OR_URL"),
        (lambda p: WarmStartConfig([{"storage": "x", "name": "y"}]), ".name: no such key"),
        (
            lambda p: WarmStartConfig([{"storage": f"sqlite:///{p}/none.db", "study_name": "s"}]),
            "no study storage at",
        ),
        (lambda p: _bad_results(p, "a: [b"), "is not YAML"),
        (lambda p: _bad_results(p, "- a list"), "names no study"),
        (lambda p: WarmStartConfig([{"sweep_dir": str(p), "storage": "x"}]), "not both"),
    ],
)
def test_a_bad_source_is_one_line_before_anything_is_written(tmp_path, make, needle):
    cfg = make(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(SweepConfigError) as e:
        _plan(cfg)
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_space_with_nothing_in_common_or_other_directions_is_one_line(tmp_path):
    path = _source(tmp_path)
    other = {"lr": FloatDistribution(1e-4, 1e-2, log=True)}
    with pytest.raises(SweepConfigError, match="nothing of this search space"):
        plan_warm_start(_warm(path), Target(other, ["minimize"]), MASK)
    with pytest.raises(SweepConfigError, match="its values cannot be observed here"):
        _plan(_warm(path, take="observe"), directions=("maximize",))


def test_several_objectives_enqueue_the_pareto_front_first_and_observe_both_values(tmp_path):
    path = str(tmp_path / "two.journal")
    study = optuna.create_study(
        study_name="old", storage=journal(path), directions=["minimize", "maximize"]
    )
    dist = {"x": FloatDistribution(-10.0, 10.0)}
    for x, values in [(0.0, [1.0, 1.0]), (1.0, [2.0, 5.0]), (2.0, [3.0, 0.0]), (3.0, [0.5, 0.5])]:
        study.add_trial(
            optuna.trial.create_trial(params={"x": x}, distributions=dist, values=values)
        )
    cfg = WarmStartConfig(studies=[{"storage": path, "study_name": "old"}], top_k=3)
    x = {"x": FloatDistribution(-8.0, 8.0)}
    warm = plan_warm_start(cfg, Target(x, ["minimize"] * 2), MASK)
    assert warm is not None
    assert [p["x"] for p, _ in warm.enqueued] == [0.0, 1.0, 3.0]  # the front (0, 1, 3), then 2
    observe = WarmStartConfig(studies=cfg.studies, take="observe")
    directions = ["minimize", "maximize"]
    seen = plan_warm_start(observe, Target(x, directions), MASK)
    assert seen is not None and [t.values for t in seen.observed][1] == [2.0, 5.0]


# A sweep of an app of one's own (tests/own_app), in this process, warm-started.


def _sweep(runner, sweep_dir: Path, n: int, *extra: str) -> dict:
    """The study's optimization_results.yaml; the sweep's directory copied to `sweep_dir` (the
    runner removes its own when it ends)."""
    work = sweep_dir.parent / f"{sweep_dir.name}-work"
    overrides = [
        "steps=6",
        f"+hpo.n_trials={n}",
        "+hpo.pruner=none",
        "+hpo.sampler_args={n_startup_trials: 3}",
        *extra,
    ]
    sweep_own_app(runner, work, overrides, keep=sweep_dir)
    return yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())


@pytest.mark.integration
def test_a_sweep_starts_from_an_earlier_sweep_directory(hydra_sweep_runner, tmp_path):
    first = _sweep(hydra_sweep_runner, tmp_path / "first", 6)
    source = f"+hpo.warm_start.studies=[{{sweep_dir: {tmp_path / 'first'}}}]"
    second = _sweep(hydra_sweep_runner, tmp_path / "second", 3, source, "+hpo.warm_start.top_k=2")
    study = optuna.load_study(
        study_name="hydratrain", storage=journal(str(tmp_path / "second" / "study.journal"))
    )
    old = optuna.load_study(
        study_name="hydratrain", storage=journal(str(tmp_path / "first" / "study.journal"))
    )
    best_two = sorted(old.trials, key=lambda t: t.value)[:2]
    assert [t.params for t in study.trials[:2]] == [t.params for t in best_two]
    assert [t.user_attrs[FROM] for t in study.trials[:2]] == [
        f"hydratrain#{t.number}" for t in best_two
    ]
    assert len(study.trials) == 3  # the enqueued ones are this study's trials: counted
    assert second["warm_start"]["enqueued"] == 2 and second["best_value"] <= first["best_value"]


GP = ["+hpo.sampler=gp", "+hpo.seed=2"]  # its 3 start-up trials drawn at random


@pytest.mark.integration
def test_observed_trials_inform_the_sampler_and_are_never_the_best(hydra_sweep_runner, tmp_path):
    """The first sweep's trials, observed, take GPSampler past its random start-up trials at
    once: the second sweep samples next to the optimum (x = 2) from its first trial, where a
    cold one draws at random; its results count and rank its own trials only."""
    _sweep(hydra_sweep_runner, tmp_path / "first", 8, "+hpo.seed=1")
    storage = tmp_path / "first" / "study.journal"
    source = f"+hpo.warm_start.studies=[{{storage: {storage}, study_name: hydratrain}}]"
    observe = [source, "+hpo.warm_start.take=observe", *GP]
    warm = _sweep(hydra_sweep_runner, tmp_path / "warm", 3, *observe)
    _sweep(hydra_sweep_runner, tmp_path / "cold", 3, *GP)

    def own(name: str) -> list[optuna.trial.FrozenTrial]:
        study = optuna.load_study(
            study_name="hydratrain", storage=journal(str(tmp_path / name / "study.journal"))
        )
        return [t for t in study.trials if not is_borrowed(t)]

    assert warm["warm_start"]["observed"] == 8 and warm["trials"] == {"COMPLETE": 3}
    assert warm["best_trial"] in [t.number for t in own("warm")]
    miss = {name: sum(abs(t.params["x"] - 2.0) for t in own(name)) / 3 for name in ("warm", "cold")}
    assert miss["warm"] < miss["cold"] / 2, miss
