"""An app of one's own whose config declares no training schedule (no training.max_steps and
eval_every) still gets a compute budget: `hpo.budget_trials=N` spends N full trials' worth,
the full trial learned from the first one to complete (or declared by hpo.max_resource), and
the pruner's rungs follow the same resource. Without it the study counted each pruned trial as
a whole one and stopped having trained a small part of its budget."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from app.config.budget import ReportAxis
from hydra_plugins.hydratrain_optuna_sweeper._pruners._learned import (
    AXIS,
    axis_of,
    learn_axis,
)
from hydra_plugins.hydratrain_optuna_sweeper._study._cost import budget_text
from hydra_plugins.hydratrain_optuna_sweeper._study._settings import TrialCount
from hydra_plugins.hydratrain_optuna_sweeper._study._storage import journal
from tests.own_sweep import sweep_own_app

pytestmark = pytest.mark.integration

STEPS, EVERY, WORTH = 100, 5, 4  # the app: its fidelity every 5 steps up to 100


def _study(runner, tmp_path: Path, *extra: str) -> optuna.Study:
    storage = tmp_path / "own.journal"
    overrides = [
        "hydra/sweeper/sampler=random",
        "hydra.sweeper.sampler.seed=0",
        f"steps={STEPS}",
        f"every={EVERY}",
        f"+hpo.budget_trials={WORTH}",
        "+hpo.study_name=own",
        f"+hpo.storage={storage}",
        *extra,
    ]
    sweep_own_app(runner, tmp_path / "multirun", overrides)
    return optuna.load_study(study_name="own", storage=journal(str(storage)))


def _trained(study: optuna.Study) -> int:
    """Steps the study's trials trained: each its last report."""
    return sum(t.last_step or 0 for t in study.trials)


def test_an_app_without_a_schedule_spends_its_budget_in_full_trials_learned_from_the_first(
    hydra_sweep_runner, tmp_path
):
    study = _study(hydra_sweep_runner, tmp_path)
    full = WORTH * STEPS
    assert full <= _trained(study) < full + STEPS  # N full trials' worth, within one trial
    assert study.user_attrs[AXIS] == {
        "every": EVERY,
        "last": STEPS,
        "unit": "steps",
        "source": "learned from trial 0, the first to complete: its last report",
    }
    pruned = [t for t in study.trials if t.state == TrialState.PRUNED]
    assert pruned, "what the pruner stops buys more trials"
    # successive halving's rungs on the learned axis: the first report at or past 100 / 9
    assert {t.last_step for t in pruned} <= {15, 45}
    assert study.trials[0].state == TrialState.COMPLETE  # nothing judged before it is known


def test_an_hpo_node_may_declare_the_full_resource_and_the_interval(hydra_sweep_runner, tmp_path):
    declared = [f"+hpo.max_resource={STEPS}", f"+hpo.report_every={EVERY}"]
    study = _study(hydra_sweep_runner, tmp_path, *declared)
    full = WORTH * STEPS
    assert full <= _trained(study) < full + STEPS
    pruned = [t for t in study.trials if t.state == TrialState.PRUNED]
    assert pruned and {t.last_step for t in pruned} <= {15, 45}
    assert AXIS not in study.user_attrs  # declared: nothing learned


def test_the_first_line_says_what_a_full_trial_is_and_where_that_came_from():
    budget = TrialCount(None, False, "hpo.budget_trials", worth=60.0)
    learned = budget_text(budget, None, None)
    head = "60 trials' worth of training (hpo.budget_trials: a full trial's length is not known"
    assert head in learned and "learned from the first trial to complete" in learned
    declared = budget_text(budget, None, ReportAxis(5, 100, source="hpo.max_resource"))
    said = "(hpo.budget_trials: 6,000 steps, a full trial being 100 steps (hpo.max_resource)"
    assert said in declared


def test_the_axis_is_the_first_completed_trials_last_report_and_the_interval_of_its_reports():
    study = optuna.create_study()
    pruned = study.ask()
    pruned.report(1.0, 10)
    study.tell(pruned, state=TrialState.PRUNED)
    assert axis_of(study) is None  # no trial completed: not known yet
    done = study.ask()
    for step in (0, 6, 12, 18, 20):
        done.report(1.0, step)
    study.tell(done, 1.0)
    axis = learn_axis(study.trials)
    assert axis == ReportAxis(every=2, last=20)
    assert axis_of(study) == axis and AXIS in study.user_attrs  # recorded for every worker
