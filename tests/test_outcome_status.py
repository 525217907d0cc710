"""How a job's exception becomes a trial state: the app says it with a typed Status
(app.hpo.status_of), the sweeper maps each Status in one place (_outcomes.from_exception)."""

from __future__ import annotations

import optuna
import pytest
import torch
from optuna.trial import TrialState

from app.core.outcomes import Diverged, Preempted, Pruned, TrainingOOM, WriteFailed
from app.hpo import Status, status_of
from hydra_plugins.hydratrain_optuna_sweeper._outcomes import from_exception


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
