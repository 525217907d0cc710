"""What a study spends: `hpo.budget_s` caps the device-seconds of the whole study (shared by
its workers), and `device_seconds` is an objective, recorded per trial, that counts what a
configuration cost over its whole line of trials (a paused and promoted one included)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from omegaconf import OmegaConf
from optuna.trial import TrialState

from hydra_plugins.hydratrain_optuna_sweeper._errors import SweepConfigError
from hydra_plugins.hydratrain_optuna_sweeper._pruners._lineage import root
from hydra_plugins.hydratrain_optuna_sweeper._study._cost import CostCap
from hydra_plugins.hydratrain_optuna_sweeper._study._settings import Liveness, read_settings
from hydra_plugins.hydratrain_optuna_sweeper._study._shared import StudyTrialBudget
from hydra_plugins.hydratrain_optuna_sweeper._study._stock import StockOptions
from hydra_plugins.hydratrain_optuna_sweeper._study._storage import journal
from tests import procs

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
FAKE = [*procs.FAKE, "-m", "hpo=optuna"]
LIVE = Liveness(
    heartbeat_interval=15, stale_after=120, retry_stale=0, wait_for_running=True, poll_interval=1
)
optuna.logging.set_verbosity(optuna.logging.WARNING)


def _worker(path: Path, budget_s: float) -> tuple[optuna.Study, StudyTrialBudget]:
    """A worker's view of the shared study: its own Study object and budget."""
    study = optuna.load_study(study_name="c", storage=journal(str(path)))
    lock = f"{path}.budget.lock"  # the sweeper's (StorageSpec.lock_path); .lock is Optuna's own
    return study, StudyTrialBudget(study, 10, lock, LIVE, cost=CostCap(study, budget_s))


def _spend(study: optuna.Study, budget: StudyTrialBudget, seconds: float) -> None:
    (trial,) = budget.next_trials(1)
    trial.set_user_attr("device_seconds", seconds)
    study.tell(trial, 1.0)
    budget.done(trial)


def test_the_device_seconds_cap_is_shared_by_the_workers_of_a_study(tmp_path):
    path = tmp_path / "s.journal"
    optuna.create_study(study_name="c", storage=journal(str(path)))
    (a, budget_a), (b, budget_b) = _worker(path, 5.0), _worker(path, 5.0)
    _spend(a, budget_a, 2.0)
    _spend(b, budget_b, 2.0)  # 4 of 5 spent: still a trial
    _spend(a, budget_a, 2.0)  # 6: the cap is passed, for every worker
    assert budget_b.next_trials(1) == [] and budget_a.next_trials(1) == []
    assert len(a.get_trials()) == 3  # far below n_trials=10


@pytest.mark.parametrize("value", [0, -5, float("inf"), "soon"])
def test_a_bad_budget_s_is_one_line_naming_it(value):
    node = OmegaConf.create({"n_trials": 4, "budget_s": value})
    with pytest.raises(SweepConfigError, match=r"^hpo\.budget_s") as err:
        read_settings(StockOptions(stock_node=False), node, "/tmp/sweep")
    assert "\n" not in str(err.value)


def _fake(tmp_path: Path, *args: str) -> tuple[list[optuna.trial.FrozenTrial], str]:
    base = [
        "hpo.study_name=t",
        f"hpo.storage={tmp_path}/study.journal",
        f"hydra.sweep.dir={tmp_path}/multirun",
        "hpo.tensorboard=false",
    ]
    env = procs.environment(out=tmp_path)
    proc = procs.run([*FAKE, *base, *args], env=env, timeout=240, check=True)
    study = optuna.load_study(study_name="t", storage=journal(str(tmp_path / "study.journal")))
    return study.get_trials(), proc.stdout + proc.stderr


@pytest.mark.slow
def test_a_study_stops_asking_for_trials_once_its_device_seconds_are_spent(tmp_path):
    # Each fake trial trains 20 steps at 0.1 device-seconds each: 2.0 a trial.
    trials, out = _fake(tmp_path, "hpo.n_trials=10", "hpo.pruner=none", "hpo.budget_s=5")
    assert len(trials) == 3  # 2 + 2 < 5 asks a third; 6 >= 5 stops
    assert "at most 5 device-seconds (hpo.budget_s)" in out
    assert "hpo.budget_s=5 spent (6.0 device-seconds recorded): no more trials" in out
    assert [t.user_attrs["device_seconds"] for t in trials] == pytest.approx([2.0] * 3)
    assert all(t.state == TrialState.COMPLETE for t in trials)


@pytest.mark.slow
def test_the_cost_objective_of_a_promoted_trial_is_its_whole_lines(tmp_path):
    """Trial 0 (the best lr) pauses at each rung (steps 5 and 15 of 20) and is promoted from
    each: three jobs of 0.5, 1.0 and 0.5 device-seconds, one configuration of 2.0."""
    lrs = ",".join(f"{{training.lr:{lr}}}" for lr in (3e-3, 1e-3, 3e-4))
    trials, _ = _fake(
        tmp_path,
        "hpo.n_trials=3",
        "hpo.pruner=asha",
        "hpo.metric=[final_val_loss,device_seconds]",
        f"hpo.enqueue=[{lrs}]",
    )
    line = [t for t in trials if root(t) == 0]
    assert [t.state for t in line] == [TrialState.PRUNED] * 2 + [TrialState.COMPLETE]
    spent = [t.user_attrs["device_seconds"] for t in line]
    assert spent == pytest.approx([0.5, 1.0, 0.5])  # each job records its own
    assert line[-1].values[1] == pytest.approx(2.0)  # the configuration's cost: the whole line


@pytest.mark.slow
def test_the_real_trainer_records_its_device_seconds_and_a_study_can_minimize_them(tmp_path):
    from app.engine.records.summary import Summary

    args = [
        "hpo=optuna",
        "hpo.study_name=t",
        "hpo.n_trials=2",
        f"hpo.storage={tmp_path}/study.journal",
        f"hydra.sweep.dir={tmp_path}/multirun",
        f"data.cache_dir={tmp_path}/cache",
        "hpo.metric=[final_val_loss,device_seconds]",
        "hpo.pruner=none",
        "hpo.tensorboard=false",
        "gpu=cpu",
        "training.max_steps=4",
        "training.eval_every=2",
        "training.eval_samples=8",
        "training.micro_batch_size=4",
        "training.progress_bar=false",
        "data.builtin_num_docs=200",
        "data.seq_len=64",
        "hydra.sweeper.params={training.effective_batch_size:'choice(8, 16)'}",
    ]
    env = procs.environment(OMP_NUM_THREADS="1")
    procs.run([*procs.TRAIN, "-m", *args], env=env, timeout=400, check=True)
    study = optuna.load_study(study_name="t", storage=journal(str(tmp_path / "study.journal")))
    assert [d.name for d in study.directions] == ["MINIMIZE", "MINIMIZE"]
    for t in study.get_trials():
        summary = Summary.read(t.user_attrs["run_dir"])
        busy = summary.train_time_s + summary.eval_time_s
        assert summary.device_seconds == pytest.approx(busy * summary.world_size)
        assert t.user_attrs["device_seconds"] == summary.device_seconds > 0
        assert t.values[1] == summary.device_seconds
