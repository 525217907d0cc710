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
from optuna.trial import TrialState

from hydra_plugins.hydratrain_optuna_sweeper._settings import Liveness
from hydra_plugins.hydratrain_optuna_sweeper._storage import journal
from hydra_plugins.hydratrain_optuna_sweeper._study import StudyBudget, counted

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
    budget = StudyBudget(study, N_TRIALS, lock, LIVE)
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
