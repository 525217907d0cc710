"""The end of a study-wide budget: a worker that waits for another worker's running trial
(hpo.wait_for_running) looks again within END_LOOK, whatever hpo.poll_interval says, so a
fleet ends soon after its last trial rather than up to a poll interval later."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hydra_plugins.hydratrain_optuna_sweeper._sweep import _worker
from hydra_plugins.hydratrain_optuna_sweeper._sweep._worker import END_LOOK, Worker

pytestmark = pytest.mark.unit


class SpentBudget:
    """No trial left to ask; another worker's trial runs for `looks` more looks."""

    def __init__(self, looks: int) -> None:
        self.looks = looks

    def next_trials(self, k: int) -> list:
        return []

    def others_running(self) -> bool:
        self.looks -= 1
        return self.looks >= 0

    def promote_at_end(self) -> bool:
        return False


def test_a_worker_waiting_at_the_end_looks_again_within_end_look(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(_worker.time, "sleep", slept.append)
    liveness = SimpleNamespace(wait_for_running=True, poll_interval=2.0)
    worker = SimpleNamespace(
        plan=SimpleNamespace(budget=SpentBudget(looks=3)),
        s=SimpleNamespace(n_jobs=1, liveness=liveness),
        stop=SimpleNamespace(requested=False),
    )
    assert Worker._next_trials(worker) == []  # the other trial ended: nothing left
    assert slept == [END_LOOK] * 3 and END_LOOK <= 0.1
    liveness.poll_interval = 0.1  # a shorter poll interval still rules
    worker.plan.budget = SpentBudget(looks=1)
    slept.clear()
    assert Worker._next_trials(worker) == [] and slept == [0.1]
