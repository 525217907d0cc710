"""The study-wide budget under contention: 8 worker processes released at one instant by a
barrier, on a budget of 3. Each guard has a test that fails without it:

- journal file: the count-ask-recheck runs under a file lock, so no trial beyond the budget is
  even created (`budget_lock` made a no-op: surplus trials appear);
- database (no lock across machines): a trial asked beyond the budget is failed and uncounted
  at once, so the study never holds more than 3 counted trials (`_is_surplus` answering False:
  more than 3 count).
"""

from __future__ import annotations

import multiprocessing as mp

import optuna
import pytest
from optuna.trial import TrialState

from app.config.budget import ReportAxis
from hydra_plugins.hydratrain_optuna_sweeper._study._settings import Liveness
from hydra_plugins.hydratrain_optuna_sweeper._study._shared import StudyTrialBudget, counted
from hydra_plugins.hydratrain_optuna_sweeper._study._storage import journal

pytestmark = pytest.mark.unit

WORKERS = 8
N_TRIALS = 3
LIVE = Liveness(
    heartbeat_interval=15, stale_after=120, retry_stale=0, wait_for_running=False, poll_interval=1
)


def _storage(kind: str, path: str):
    return journal(path) if kind == "journal" else f"sqlite:///{path}"


def _work(kind: str, path: str, barrier, done) -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.load_study(study_name="b", storage=_storage(kind, path))
    lock = f"{path}.budget.lock" if kind == "journal" else None
    budget = StudyTrialBudget(study, N_TRIALS, lock, LIVE)
    barrier.wait()
    ran = 0
    while trials := budget.next_trials(1):
        for trial in trials:
            trial.suggest_float("x", 0.0, 1.0)
            study.tell(trial, 1.0)
            ran += 1
    done.put(ran)


def _race(kind: str, path: str) -> list[optuna.trial.FrozenTrial]:
    optuna.create_study(study_name="b", storage=_storage(kind, path))
    ctx = mp.get_context("fork")
    barrier, done = ctx.Barrier(WORKERS), ctx.Queue()
    procs = [ctx.Process(target=_work, args=(kind, path, barrier, done)) for _ in range(WORKERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    assert sum(done.get(timeout=5) for _ in procs) == N_TRIALS  # ran by the workers in all
    return optuna.load_study(study_name="b", storage=_storage(kind, path)).get_trials()


def test_on_a_journal_the_lock_lets_no_trial_beyond_the_budget_exist(tmp_path):
    trials = _race("journal", str(tmp_path / "b.journal"))
    assert len(trials) == N_TRIALS  # not even a discarded surplus trial
    assert all(t.state == TrialState.COMPLETE for t in trials)


def test_on_a_database_a_surplus_trial_is_failed_and_never_counted(tmp_path):
    trials = _race("sqlite", str(tmp_path / "b.db"))
    kept = [t for t in trials if counted(t)]
    assert len(kept) == N_TRIALS and all(t.state == TrialState.COMPLETE for t in kept)
    surplus = [t for t in trials if not counted(t)]
    assert all(t.state == TrialState.FAIL and t.user_attrs["reason"] == "surplus" for t in surplus)


# hpo.budget_trials: the budget in full trials' worth of training.


def _prune_at(study: optuna.Study, trial: optuna.Trial, step: int) -> None:
    trial.suggest_float("x", 0.0, 1.0)
    trial.report(1.0, step)
    study.tell(trial, state=TrialState.PRUNED)


def test_trials_stopped_early_spend_their_share_and_buy_more_trials():
    """Worth 2 full trials of a 90-sample axis: one completed trial spends 1, each trial pruned
    at 30 spends a third, so three of them fit in the second; the fourth is never asked."""
    from hydra_plugins.hydratrain_optuna_sweeper._study._cost import TrialsWorth

    study = optuna.create_study()
    worth = TrialsWorth(study, 2.0, ReportAxis(30, 90))
    budget = StudyTrialBudget(study, None, None, LIVE, worth=worth)
    (first,) = budget.next_trials(1)
    first.suggest_float("x", 0.0, 1.0)
    study.tell(first, 1.0)
    pruned = 0
    while trials := budget.next_trials(1):
        _prune_at(study, trials[0], 30)
        pruned += 1
    assert pruned == 3 and worth.spent() == pytest.approx(2.0)
    assert len(study.trials) == 4


def test_a_running_trial_counts_what_it_reported_and_a_line_counts_once():
    from hydra_plugins.hydratrain_optuna_sweeper._pruners._asha import promotion
    from hydra_plugins.hydratrain_optuna_sweeper._study._cost import trials_worth

    study = optuna.create_study()
    paused = study.ask()
    paused.suggest_float("x", 0.0, 1.0)
    paused.report(2.0, 30)
    paused.set_user_attr("run_dir", "/runs/0")
    study.tell(paused, state=TrialState.PRUNED)
    assert trials_worth(study.get_trials(), 90) == 1 / 3
    study.add_trial(promotion(study.trials[0]))  # its line: reports up to 30, WAITING
    copy = study.ask()  # the promotion, resumed: it reports on, from 30
    copy.report(1.5, 60)
    # the line's furthest, not 30 + 60
    assert trials_worth(study.get_trials(), 90) == pytest.approx(2 / 3)
    study.tell(copy, 1.4)
    assert trials_worth(study.get_trials(), 90) == 1.0
    surplus = study.ask()
    surplus.set_user_attr("reason", "surplus")
    study.tell(surplus, state=TrialState.FAIL)
    assert trials_worth(study.get_trials(), 90) == 1.0
