"""hpo.pruner=asha with the real trainer: a paused trial, promoted, resumes from the checkpoint
its pause wrote and ends exactly where the same trial run without a pause ends."""

from __future__ import annotations

import os
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from app.engine.records.summary import Summary
from hydra_plugins.hydratrain_optuna_sweeper._pruners._asha import PAUSED
from hydra_plugins.hydratrain_optuna_sweeper._pruners._lineage import root
from hydra_plugins.hydratrain_optuna_sweeper._study._storage import journal
from tests import procs

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]
# 6 steps evaluated every 2: one rung, at step 2. Dropout makes the RNG state part of the
# trajectory, so a resume that lost it would end elsewhere.
TINY = [
    "gpu=cpu",
    "model.dropout=0.1",
    "training.max_steps=6",
    "training.eval_every=2",
    "training.eval_samples=8",
    "training.checkpoint_every=0",
    "training.progress_bar=false",
    "training.micro_batch_size=4",
    "data.builtin_num_docs=200",
    "data.seq_len=64",
    "hydra.sweeper.params={training.lr:'tag(log, interval(1e-7, 1e-1))'}",
    "training.warmup_steps=0",
    "hpo.tensorboard=false",
]
GOOD, BAD = "{training.lr:0.01}", "{training.lr:1e-7}"


def _sweep(tmp_path: Path, name: str, *extra: str) -> list[optuna.trial.FrozenTrial]:
    out = tmp_path / name
    env = {**os.environ, "HYDRATRAIN_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    args = [
        "hpo=optuna",
        "hpo.study_name=t",
        f"hpo.storage={out}/study.journal",
        f"hydra.sweep.dir={out}/multirun",
        f"data.cache_dir={tmp_path / 'cache'}",
        *TINY,
        *extra,
    ]
    procs.run([*procs.TRAIN, "-m", *args], env=env, timeout=400, check=True)
    storage = journal(str(out / "study.journal"))
    return optuna.load_study(study_name="t", storage=storage).get_trials()


def test_a_promoted_trial_ends_with_the_loss_of_the_same_trial_run_without_a_pause(tmp_path):
    paused_study = _sweep(
        tmp_path, "asha", "hpo.pruner=asha", "hpo.n_trials=3", f"hpo.enqueue=[{GOOD},{BAD},{BAD}]"
    )
    first = paused_study[0]
    assert first.state == TrialState.PRUNED and first.system_attrs[PAUSED] == 2
    saved = Path(first.user_attrs["run_dir"], "checkpoints")
    assert [p.name for p in saved.glob("*.pt")] == ["step_00000002.pt"]  # written by the pause
    promoted = [t for t in paused_study if root(t) == 0 and t.number != 0]
    assert len(promoted) == 1 and promoted[0].state == TrialState.COMPLETE
    summary = Summary.read(promoted[0].user_attrs["run_dir"])
    assert summary.resumed_from_step == 2 and summary.steps == 6

    (straight,) = _sweep(
        tmp_path, "none", "hpo.pruner=none", "hpo.n_trials=1", f"hpo.enqueue=[{GOOD}]"
    )
    assert straight.state == TrialState.COMPLETE and straight.params == first.params
    assert promoted[0].value == straight.value  # exactly: the same trajectory
