"""A rank that stops answering inside a collective ends the run within training.peer_timeout_s.

Rank 1 of a 2-rank trial (gloo, CPU) stops answering before its forward of step 2
(`faults.hang_rank`); rank 0 waits for it in that phase's collective. With a 5 s bound the
trial ends on both ranks within the bound and a few seconds, FAIL with one line naming the
rank, the phase and the step, and the worker runs its next trial. The subprocess timeouts
are the guard: without the bound the sweep would wait for torch's 30 minutes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime

import optuna
import pytest
from optuna.trial import TrialState

from app.engine.peers import GRACE_S
from app.engine.ranks import RankRecord, record_path
from hydra_plugins.hydratrain_optuna_sweeper._storage import journal
from tests.conftest import ROOT, TINY, run_cli, tiny

pytestmark = pytest.mark.slow
optuna.logging.set_verbosity(optuna.logging.WARNING)

BOUND_S = 5
LINE = f"rank 0 of 2: no answer from its peers within {BOUND_S}s in forward (step 2)"
HANG = ["faults.hang_rank=1", f"training.peer_timeout_s={BOUND_S}"]
# Generous: two processes start, import torch and train two steps on shared cores first.
TRIAL_LIMIT_S = 120
# After rank 0 recorded the timeout: rank 1 is ended GRACE_S later, and the agent returns.
AFTER_RECORD_S = GRACE_S + 15


def test_a_rank_that_stops_answering_ends_its_trial_within_the_bound(tmp_path):
    result = run_cli(
        "-m",
        "hpo=optuna",
        *tiny(tmp_path),
        "hpo.n_trials=2",
        "hpo.study_name=hang",
        f"hpo.storage={tmp_path}/study.journal",
        f"hydra.sweep.dir={tmp_path}/multirun",
        "hpo.tensorboard=false",
        "hpo.gpus_per_trial=2",
        "hydra.sweeper.params={faults.hang_step:'choice(2, 1000)'}",
        "hpo.enqueue=[{faults.hang_step:2},{faults.hang_step:1000}]",  # 1000: never reached
        *HANG,
        timeout=300,  # the guard: about 70 s on two shared cores; unbounded, 30 minutes
    )
    assert result.returncode == 0, result.stderr[-3000:]
    study = optuna.load_study(study_name="hang", storage=journal(f"{tmp_path}/study.journal"))
    hung, done = study.get_trials()
    # The trial failed with rank 0's one line, and ended within the bound on both ranks.
    assert hung.state == TrialState.FAIL and hung.user_attrs["reason"] == "error"
    assert hung.user_attrs["error"].endswith(f": {LINE}")
    run_dir = hung.user_attrs["run_dir"]
    waiting = RankRecord.read(record_path(run_dir, 0))
    assert (waiting.status, waiting.error, waiting.steps) == ("failed", LINE, 2)
    assert not record_path(run_dir, 1).exists()  # the lost rank was ended, saying nothing
    assert seconds(hung.datetime_start, hung.datetime_complete) < TRIAL_LIMIT_S
    recorded = datetime.fromtimestamp(waiting.ended_at or 0)
    assert seconds(recorded, hung.datetime_complete) < AFTER_RECORD_S
    # The worker went on: its next trial trained on both ranks.
    assert done.state == TrialState.COMPLETE
    statuses = [RankRecord.read(record_path(done.user_attrs["run_dir"], r)).status for r in (0, 1)]
    assert statuses == ["completed"] * 2


def test_a_torchrun_run_ends_with_the_same_line(tmp_path):
    """Plain torchrun: the waiting rank ends the run with the line and status 1; torchrun's
    agent then stops the lost rank (SIGTERM, SIGKILL 30 s later)."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    args = [*TINY, f"data.cache_dir={tmp_path / 'cache'}", "faults.hang_step=2", *HANG]
    proc = subprocess.run(
        [*launcher, "--nproc_per_node=2", "-m", "app.train", *args, f"hydra.run.dir={tmp_path}"],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    assert f"error: {LINE}\n" in proc.stderr, proc.stderr[-3000:]


def seconds(start: datetime | None, end: datetime | None) -> float:
    assert start is not None and end is not None
    return (end - start).total_seconds()
