"""How a job's exception becomes a trial state: the app says it with a typed Status
(app.hpo.status_of), the sweeper maps each Status in one place (_outcomes.from_exception)."""

from __future__ import annotations

import optuna
import pytest
import torch
from optuna.trial import TrialState

from app.core.outcomes import (
    Diverged,
    Preempted,
    Pruned,
    Status,
    TrainingOOM,
    WriteFailed,
    status_of,
)
from hydra_plugins.hydratrain_optuna_sweeper._sweep._outcomes import from_exception

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("exc", "status", "state", "reason"),
    [
        (TrainingOOM("at micro-batch 1"), Status.OOM, TrialState.PRUNED, "oom"),
        # torch's own error, raised where no recovery wraps it (building the model on the GPU)
        (torch.OutOfMemoryError("CUDA out of memory"), Status.OOM, TrialState.PRUNED, "oom"),
        (Pruned("hopeless"), Status.PRUNED, TrialState.PRUNED, "pruned"),
        # another app's job that prunes itself the Optuna way
        (optuna.TrialPruned("step 3"), None, TrialState.PRUNED, "pruned"),
        (Diverged("nan"), Status.DIVERGED, TrialState.FAIL, "diverged"),
        (Preempted("SIGTERM", signum=15), Status.PREEMPTED, TrialState.FAIL, "preempted"),
        (WriteFailed("disk full"), Status.FAILED, TrialState.FAIL, "error"),
        (ValueError("a bug"), None, TrialState.FAIL, "error"),
    ],
)
def test_each_way_a_run_ends_is_one_trial_state(exc, status, state, reason):
    assert status_of(exc) == status
    outcome = from_exception(exc)
    assert outcome.state == state
    assert outcome.attrs["reason"] == reason


def test_a_preempted_trial_names_the_signal_that_stopped_the_worker():
    assert from_exception(Preempted("SIGINT", signum=2)).preempted_by == 2
    assert from_exception(Diverged("nan")).preempted_by is None


def _worker_that(records: bool):
    """What Worker._tell needs of its worker: recording succeeds, or the trial was finished by
    another worker meanwhile."""
    from types import SimpleNamespace

    from hydra_plugins.hydratrain_optuna_sweeper import _private as private

    def record(trial, outcome):
        if not records:
            raise private.TrialFinished("finished")

    taken = []
    worker = SimpleNamespace(
        _record=record,
        _taken_over=taken.append,
        plan=SimpleNamespace(budget=SimpleNamespace(done=lambda trial: None)),
    )
    return worker, taken


@pytest.mark.parametrize("records", [True, False])
def test_an_unexpected_error_is_shown_only_for_a_trial_this_worker_records(records, caplog):
    """A job's own bug deserves its traceback; a late error of a trial another worker failed
    as stale meanwhile (a worker paused past stale_after) is dropped with one line, not a
    traceback (tests/test_sweeper_signals.py)."""
    import logging

    from hydra_plugins.hydratrain_optuna_sweeper._sweep._worker import Worker

    try:
        raise RuntimeError("Error: did not possess lock")
    except RuntimeError as exc:
        with caplog.at_level(logging.WARNING):
            outcome = from_exception(exc)
    assert not caplog.records  # classifying logs nothing: the trial may not be ours any more
    worker, taken = _worker_that(records)
    trial = optuna.create_study().ask()
    with caplog.at_level(logging.WARNING):
        Worker._tell(worker, trial, outcome)  # type: ignore[arg-type]
    shown = "\n".join(r.getMessage() for r in caplog.records)
    if records:
        assert "Trial 0 failed" in shown and "Traceback" in shown and "possess lock" in shown
    else:
        assert taken == [trial] and "Traceback" not in shown
