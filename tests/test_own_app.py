"""An app of one's own (tests/own_app: ten lines of `@hydra.main`, `reporter_for_job(cfg)`,
`rep.report(...)`, `optuna.TrialPruned`) under both sweeper nodes: its trials report, and the
hopeless ones are pruned, although its config has no hpo node to name its trial in."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from hydra_plugins.hydratrain_optuna_sweeper._study._storage import journal
from tests import procs

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "tests" / "own_app" / "own_app.py"
NODES = ["hydra/sweeper=optuna", "hydra/sweeper=hydratrain_optuna"]


def _sweep(tmp_path: Path, node: str, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable, str(APP), "-m", node,
        "hydra/sweeper/sampler=random",
        "hydra.sweeper.sampler.seed=3",
        "hydra.sweeper.n_trials=12",
        "hydra.sweeper.n_jobs=1",
        "hydra.sweeper.study_name=own",
        f"hydra.sweeper.storage={tmp_path / 'own.journal'}",
        f"hydra.sweep.dir={tmp_path / 'multirun'}",
        *extra,
    ]  # fmt: skip
    return procs.run(cmd, cwd=tmp_path)


def _launchers() -> list[object]:
    """In the sweep's process, and in processes of their own (the job then rebuilds its trial
    from the storage), where Hydra's joblib launcher is installed."""
    import importlib.util

    joblib = importlib.util.find_spec("hydra_plugins.hydra_joblib_launcher") is not None
    skip = pytest.mark.skipif(not joblib, reason="hydra-joblib-launcher is not installed")
    return ["basic", pytest.param("joblib", marks=skip)]


@pytest.mark.parametrize("launcher", _launchers())
@pytest.mark.parametrize("node", NODES)
def test_an_app_of_ones_own_reports_and_is_pruned_under_either_sweeper_node(
    tmp_path, node, launcher
):
    extra = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=1"] if launcher == "joblib" else []
    proc = _sweep(tmp_path, node, *extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    study = optuna.load_study(study_name="own", storage=journal(str(tmp_path / "own.journal")))
    states = [t.state for t in study.trials]
    assert states.count(TrialState.COMPLETE) >= 1 and states.count(TrialState.PRUNED) >= 1
    assert TrialState.FAIL not in states, [t.user_attrs for t in study.trials]
    for t in study.trials:  # every trial reported to the study, from its first step
        assert min(t.intermediate_values) == 1
        done = t.state == TrialState.COMPLETE
        assert (max(t.intermediate_values) == 27) == done
    # the app's config stays its own: nothing was added to it
    config = (tmp_path / "multirun" / "0" / ".hydra" / "config.yaml").read_text()
    assert "hpo" not in config


def test_outside_a_sweep_the_same_app_reports_to_nothing(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(APP), f"hydra.run.dir={tmp_path / 'run'}"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
