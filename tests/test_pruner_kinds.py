"""Pruners are components (hydra_plugins/.../_pruners/): each module of that room registers one
`PrunerKind`, and the sweep asks the kind, never the name, what to do. A pruner added inside a
test, touching no other file, runs a study; and no code outside a pruner's own module compares
its name."""

from __future__ import annotations

import re
from pathlib import Path

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

from hydra_plugins.hydratrain_optuna_sweeper._pruners._kind import (
    PRUNERS,
    PrunerKind,
    ReportAxis,
    build_pruner,
    pruner_kind,
    study_pruner_args,
)
from hydra_plugins.hydratrain_optuna_sweeper._study._storage import journal
from tests.own_sweep import sweep_own_app

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
STEPS = 6


class OddTrialsPruner(optuna.pruners.BasePruner):
    """Stops every odd-numbered trial once it has reported `after` steps."""

    def __init__(self, after: int = 3) -> None:
        self.after = after

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        step = trial.last_step
        return trial.number % 2 == 1 and step is not None and step >= self.after


def _odd(args: dict[str, object], schedule: ReportAxis | None) -> OddTrialsPruner:
    return OddTrialsPruner(**args)  # type: ignore[arg-type]


def _sweep(runner, tmp_path: Path, pruner: str) -> None:
    overrides = [
        "hydra/sweeper/sampler=random",
        f"steps={STEPS}",
        f"+hpo.pruner={pruner}",
        "+hpo.pruner_args={after: 2}",
        "+hpo.n_trials=4",
        "+hpo.study_name=odd",
        f"+hpo.storage={tmp_path / 'study.journal'}",
    ]
    sweep_own_app(runner, tmp_path / "multirun", overrides)


@pytest.fixture
def odd_pruner():
    """A pruner registered for this test alone: one `PRUNERS.add`, no other file touched."""
    PRUNERS.add(PrunerKind("odd_trials", build=_odd))
    yield
    PRUNERS.remove("odd_trials")


def test_a_pruner_added_in_one_place_runs_a_study_and_prunes_what_it_says(
    hydra_sweep_runner, tmp_path, odd_pruner
):
    _sweep(hydra_sweep_runner, tmp_path, "odd_trials")
    study = optuna.load_study(study_name="odd", storage=journal(str(tmp_path / "study.journal")))
    states = {t.number: t.state for t in study.trials}
    assert states == {
        0: TrialState.COMPLETE,
        1: TrialState.PRUNED,
        2: TrialState.COMPLETE,
        3: TrialState.PRUNED,
    }
    pruned = [t for t in study.trials if t.state == TrialState.PRUNED]
    assert all(t.last_step == 2 for t in pruned)  # its argument, from hpo.pruner_args


@pytest.mark.parametrize(
    "budget, first, recorded",
    [
        ("+hpo.budget_trials=10", TrialState.PRUNED, {"bootstrap_count": 2}),
        ("+hpo.n_trials=10", TrialState.COMPLETE, {}),
    ],
)
def test_a_rung_waits_for_two_trials_under_a_budget_in_worth_and_the_study_records_it(
    hydra_sweep_runner, tmp_path, budget, first, recorded
):
    """Successive halving (the default) under 10 trials' worth with an evaluation schedule: the
    first trial to reach a rung stops there (Optuna's bootstrap_count=2), and the study records
    the arguments for a launcher's jobs; under a count of 10 trials the first trial completes."""
    overrides = [
        "hydra/sweeper/sampler=random",
        "hydra.sweeper.sampler.seed=0",
        f"steps={STEPS * 3}",
        f"+training={{eval_every: 2, max_steps: {STEPS * 3}}}",
        budget,
        "+hpo.study_name=halving",
        f"+hpo.storage={tmp_path / 'study.journal'}",
    ]
    sweep_own_app(hydra_sweep_runner, tmp_path / "multirun", overrides)
    study = optuna.load_study(
        study_name="halving", storage=journal(str(tmp_path / "study.journal"))
    )
    assert study.trials[0].state == first
    # A trial that reaches the end completes with its value (its last report is not judged)
    assert any(t.state == TrialState.COMPLETE for t in study.trials)
    assert study.user_attrs["hpo:pruner_args"] == recorded


def test_an_unregistered_pruner_is_one_line_naming_the_registered_ones(
    hydra_sweep_runner, tmp_path, capsys
):
    with pytest.raises(SystemExit) as e:
        _sweep(hydra_sweep_runner, tmp_path, "odd_trials")
    assert e.value.code == 2
    allowed = ", ".join(PRUNERS.names())
    assert capsys.readouterr().err == (
        f"error: hpo.pruner='odd_trials' is not allowed; choose one of: {allowed}\n"
    )
    assert {"asha", "median", "successive_halving"} <= set(PRUNERS.names())  # modules found


def test_each_pruner_is_its_own_module_and_says_how_the_sweep_treats_it():
    room = ROOT / "hydra_plugins" / "hydratrain_optuna_sweeper" / "_pruners"
    assert set(PRUNERS.names()) == {
        p.stem[1:] for p in room.glob("_*.py") if "PrunerKind(" in p.read_text()
    } - {"kind"}
    assert [n for n in PRUNERS.names() if pruner_kind(n).pauses] == ["asha"]
    assert [n for n in PRUNERS.names() if not pruner_kind(n).judges] == ["none"]
    assert all(
        (pruner_kind(n).promoter is not None) == pruner_kind(n).pauses for n in PRUNERS.names()
    )


@pytest.mark.parametrize("name", PRUNERS.names())
@pytest.mark.parametrize("schedule", [ReportAxis(10, 100), None], ids=["schedule", "none"])
def test_every_pruner_builds_from_its_defaults_under_either_budget(name, schedule):
    """What a pruner takes from the study (its defaults, its budget's) builds it, for each one
    registered (a new one too), with an evaluation schedule or without one."""
    for worth in (20.0, None):
        args = study_pruner_args(name, {}, worth, schedule)
        assert isinstance(build_pruner(name, args, 1, schedule), optuna.pruners.BasePruner)


def _comparisons_of_pruner_names() -> list[str]:
    """Lines of app/ and the sweeper that compare a registered pruner's name, outside that
    pruner's module. The benchmarks (app/bench/) name their arms after pruners: not the sweep."""
    names = PRUNERS.names()
    found = []
    for top in ("app", "hydra_plugins"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if "bench" in path.parts:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#")[0]
                if not re.search(r"==|!=|\bin\b", code):
                    continue
                # "none" is a common value: a comparison of it counts beside the word pruner
                named = [
                    n
                    for n in names
                    if re.search(rf"[\"']{n}[\"']", code) and (n != "none" or "pruner" in code)
                ]
                if named and path.stem.lstrip("_") not in named:
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return found


def test_no_code_outside_a_pruners_module_compares_its_name():
    assert _comparisons_of_pruner_names() == []


def test_a_configuration_borrowed_from_an_earlier_study_is_not_spent_as_the_bootstrap(
    hydra_sweep_runner, tmp_path
):
    """The same study as above under 10 trials' worth, warm-started from an earlier one: its
    enqueued best configuration runs first and completes where a sampled first trial is stopped
    as the bootstrap; the sampled trials after it are still judged against it."""
    schedule = [f"steps={STEPS * 3}", f"+training={{eval_every: 2, max_steps: {STEPS * 3}}}"]
    first = [*schedule, "+hpo.n_trials=3", "+hpo.study_name=first"]
    sweep_own_app(
        hydra_sweep_runner,
        tmp_path / "first",
        [*first, "hydra/sweeper/sampler=random", f"+hpo.storage={tmp_path / 'first.journal'}"],
    )
    source = f"{{storage: {tmp_path / 'first.journal'}, study_name: first}}"
    overrides = [
        "hydra/sweeper/sampler=random",
        "hydra.sweeper.sampler.seed=0",
        *schedule,
        "+hpo.budget_trials=10",
        f"+hpo.warm_start={{studies: [{source}], top_k: 1}}",
        "+hpo.study_name=halving",
        f"+hpo.storage={tmp_path / 'study.journal'}",
    ]
    sweep_own_app(hydra_sweep_runner, tmp_path / "multirun", overrides)
    study = optuna.load_study(
        study_name="halving", storage=journal(str(tmp_path / "study.journal"))
    )
    assert "warm_start_from" in study.trials[0].user_attrs
    assert study.trials[0].state == TrialState.COMPLETE
    assert study.trials[1].state == TrialState.PRUNED  # sampled: the bootstrap's second slot
