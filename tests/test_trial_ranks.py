"""A trial on two ranks (`hpo.gpus_per_trial=2`) on CPU with gloo: torch's launcher API
starts the ranks from the worker, rank 0 reports, and each trial gets one state whatever
each rank saw. One study of three queued trials: one completes, one is pruned, one runs out
of memory on rank 1."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from app.engine.ranks import RankRecord, record_path
from hydra_plugins.hydratrain_optuna_sweeper._study._storage import journal
from tests import procs
from tests.conftest import tiny

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
optuna.logging.set_verbosity(optuna.logging.WARNING)

GOOD, BAD = 0.01, 1e-6  # a learning rate that learns in 3 steps, and one that does not
QUEUE = (
    f"hpo.enqueue=[{{training.lr:{GOOD},faults.oom_above_micro_batch:1000}},"
    f"{{training.lr:{BAD},faults.oom_above_micro_batch:1000}},"
    f"{{training.lr:{GOOD},faults.oom_above_micro_batch:2}}]"
)


def test_each_trial_runs_as_two_ranks_with_one_owner_and_one_state(tmp_path):
    result = procs.train(
        "-m",
        "hpo=optuna",
        *tiny(tmp_path, "training.warmup_steps=0"),
        "hpo.n_trials=3",
        "hpo.study_name=ranks",
        f"hpo.storage={tmp_path}/study.journal",
        f"hydra.sweep.dir={tmp_path}/multirun",
        "hpo.tensorboard=false",
        "hpo.gpus_per_trial=2",
        "hydra.sweeper.params={training.lr:'choice(0.01, 0.000001)',"
        "faults.oom_above_micro_batch:'choice(1000, 2)'}",
        "faults.oom_rank=1",  # the third trial: micro-batch 4 runs out on rank 1 only
        # Recovery off: the OOM ends the trial (with it on, both ranks shrink and redo the
        # step together: tests/test_fsdp.py).
        "training.auto_batch.oom_recovery=false",
        QUEUE,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    study = optuna.load_study(study_name="ranks", storage=journal(f"{tmp_path}/study.journal"))
    done, pruned, oom = study.get_trials()
    ranks = [[RankRecord.read(record_path(t.user_attrs["run_dir"], r)) for r in (0, 1)]
             for t in (done, pruned, oom)]  # fmt: skip
    for trial, records in zip((done, pruned, oom), ranks, strict=True):
        # Both ranks trained what the worker sampled for the trial, in processes of their own.
        assert [r.training["lr"] for r in records] == [trial.params["training.lr"]] * 2
        assert records[0].pid != records[1].pid and {r.world_size for r in records} == {2}
    assert done.state == TrialState.COMPLETE
    assert [r.status for r in ranks[0]] == ["completed"] * 2
    assert sorted(done.intermediate_values) == [3, 6]
    # The prune reached both ranks at the same evaluation, and the trial has one state.
    assert pruned.state == TrialState.PRUNED and pruned.user_attrs["reason"] == "pruned"
    assert [(r.status, r.steps) for r in ranks[1]] == [("pruned", 3)] * 2
    # Rank 1 ran out of memory; rank 0 lost its peer: one outcome, the OOM.
    assert [r.status for r in ranks[2]] == ["failed", "oom"]
    assert oom.state == TrialState.PRUNED and oom.user_attrs["reason"] == "oom"
    # Reported once: a second report of a step would be ignored with Optuna's warning.
    assert "is already reported" not in result.stdout + result.stderr
