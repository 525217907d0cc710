"""The fleet parent's trial lines: a local fleet's workers start before the parent has opened
the study, so a trial they finish meanwhile is still one of the fleet's and gets its line;
trials of earlier runs do not."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

import optuna
import pytest

from hydra_plugins.hydratrain_optuna_sweeper._fleet._local import TrialTicker

pytestmark = pytest.mark.unit


def test_the_ticker_prints_the_trials_finished_since_the_fleet_started(caplog):
    study = optuna.create_study()
    earlier = study.ask()
    study.tell(earlier, 1.0)  # a previous run's
    started = datetime.now() + timedelta(microseconds=1)
    while datetime.now() < started:  # the clock moves past the previous run's trial
        pass
    early = study.ask()  # a worker's, told before the parent reads the study
    early.set_user_attr("worker", 1)
    study.tell(early, 2.0)
    ticker = TrialTicker(study, since=started)
    late = study.ask()
    study.tell(late, 3.0)
    with caplog.at_level(logging.INFO):
        ticker.poll()
        ticker.poll()  # once each
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Trial ")]
    assert lines == ["Trial 1 COMPLETE [2.0] worker 1", "Trial 2 COMPLETE [3.0] "]
