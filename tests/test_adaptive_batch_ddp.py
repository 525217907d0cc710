"""training.batch_schedule=adaptive under torchrun (two gloo ranks): every rank changes the batch
at the step rank 0 decides, whatever its own reading of the noise scale."""

from __future__ import annotations

import textwrap

import pytest

from app.config.phases import BatchPhases
from app.engine.records.summary import Summary
from tests import procs
from tests.conftest import tiny
from tests.test_adaptive_batch import ADAPTIVE

pytestmark = pytest.mark.e2e

# Rank 1 reads no noise scale at all (the estimate "not known yet", for the whole run), and says
# so in a file: a rank deciding for itself would never double, and its micro-batches would no
# longer pair up with rank 0's.
BLIND_RANK_1 = """
import os
if os.environ.get("RANK") == "1":
    from pathlib import Path
    from app.engine.records.noise_scale import NoiseScale
    NoiseScale.value = lambda self: None
    Path(os.environ["BLIND_MARK"]).write_text("rank 1 reads no noise scale")
"""


@pytest.mark.slow
@pytest.mark.parametrize("micro", ["fixed", "auto"])
def test_two_ranks_change_the_batch_at_the_step_rank_0_decides(tmp_path, micro):
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(textwrap.dedent(BLIND_RANK_1))
    mark = tmp_path / "blind"
    # Batch 5 over 2 ranks: shares 3 and 2, then 5 and 5, 10 and 10 (micro-batch 2 each).
    args = tiny(
        tmp_path,
        *ADAPTIVE,
        "training.effective_batch_size=5",
        "training.max_effective_batch=20",
        "training.peer_timeout_s=60",
    )
    if micro == "auto":  # probed up to 8 a rank: the micro-batch grows with the shares
        args += [
            "training.micro_batch_size=auto",
            "training.auto_batch.cpu_max_micro_batch=8",
            "training.auto_batch.throughput_aware=false",
        ]
    env = procs.environment(path=(procs.ROOT, shim), OMP_NUM_THREADS="1", BLIND_MARK=str(mark))
    ranks = [*procs.TORCHRUN, "--nproc_per_node=2", "-m", "app.train", *args]
    procs.run([*ranks, f"hydra.run.dir={tmp_path / 'ddp'}"], env=env, timeout=600, check=True)
    assert mark.read_text() == "rank 1 reads no noise scale"
    summary = Summary.read(tmp_path / "ddp")
    assert summary.world_size == 2 and summary.status == "completed"
    phases = BatchPhases.from_json(summary.batch_schedule or [])
    assert [p.batch for p in phases.phases] == [5, 10, 20]
    assert summary.samples_seen == phases.samples_seen(summary.steps) >= 200
    # Batch 20: shares of 10, micro-batch 2 by hand; probed, half the share (the noise scale)
    assert summary.micro_batch_sizes == ([5, 5] if micro == "auto" else [2] * 5)


@pytest.mark.slow
def test_a_study_searches_the_batch_schedule_and_its_report_draws_each_trials_batch(tmp_path):
    """`training.batch_schedule` searched like any setting (`-m hpo=optuna`): the adaptive
    trial carries its batch over its data (user attr batch_schedule), the fixed one none, and
    the study's report draws the adaptive one's batch over its data."""
    import optuna
    import yaml

    from hydra_plugins.hydratrain_optuna_sweeper._study._storage import journal

    sweep = tmp_path / "sweep"
    searched = [a for a in ADAPTIVE if not a.startswith("training.batch_schedule=")]
    args = tiny(
        tmp_path,
        *searched,  # a setting given on the command line is not searched: it is fixed
        "hpo=optuna",
        "hpo.study_name=t",
        f"hpo.storage={tmp_path / 'study.journal'}",
        f"hydra.sweep.dir={sweep}",
        "hpo.n_trials=2",
        "hpo.pruner=none",
        "hpo.tensorboard=false",
        "hydra.sweeper.params={training.batch_schedule:'choice(fixed, adaptive)'}",
        "hpo.enqueue=[{training.batch_schedule: fixed},{training.batch_schedule: adaptive}]",
    )
    procs.run([*procs.TRAIN, "-m", *args], timeout=400, check=True)
    study = optuna.load_study(study_name="t", storage=journal(str(tmp_path / "study.journal")))
    fixed, adaptive = study.trials
    assert fixed.params == {"training.batch_schedule": "fixed"}
    assert "batch_schedule" not in fixed.user_attrs or fixed.user_attrs["batch_schedule"] is None
    phases = BatchPhases.from_json(adaptive.user_attrs["batch_schedule"])
    assert [p.batch for p in phases.phases] == [4, 8, 16]
    assert adaptive.user_attrs["samples_seen"] == phases.samples_seen(
        Summary.read(adaptive.user_attrs["run_dir"]).steps
    )
    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert results["trials"] == {"COMPLETE": 2}
    page = (sweep / "report.html").read_text()
    assert "<section id='batches' data-drawn=\"true\">" in page
