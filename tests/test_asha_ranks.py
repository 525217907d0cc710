"""hpo.pruner=asha with trials on two ranks (`hpo.gpus_per_trial=2`, gloo on CPU): rank 0's
pause reaches both ranks at the rung, each saves its part of the checkpoint (rank 0 the file
under DDP, each rank its shards under FSDP), the trial is recorded as paused, and its
promotion resumes on both ranks and ends exactly where the same trial never paused ends."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from app.core.outcomes import Paused, RunOutcome, Status
from app.engine.ranks import RankRecord, one_outcome, record_path
from app.engine.records.summary import Summary
from hydra_plugins.hydratrain_optuna_sweeper._pruners._asha import PAUSED
from hydra_plugins.hydratrain_optuna_sweeper._study._storage import journal
from tests import procs
from tests.conftest import tiny

pytestmark = pytest.mark.e2e

optuna.logging.set_verbosity(optuna.logging.WARNING)

RUNG = 3  # 6 steps evaluated every 3: asha's one rung (successive halving's first) is step 3
LAUNCH_TIMEOUT = 400  # seconds: ranks that never agree hang; the test fails, bounded


def _record(
    rank: int, status: Status, steps: int = 0, paused_at: int | None = None, error: str = ""
) -> RankRecord:
    return RankRecord(rank, 2, 100 + rank, None, status.value, steps, paused_at=paused_at,
                      error=error or None)  # fmt: skip


def test_a_trial_is_paused_only_when_every_rank_paused_at_its_rung():
    paused = [_record(r, Status.PAUSED, steps=3, paused_at=3) for r in (0, 1)]
    with pytest.raises(Paused) as exc:
        one_outcome(paused)
    assert exc.value.step == 3 and exc.value.status == Status.PAUSED
    # The rung is the study's step the pause was reported at, not the optimizer steps done
    # (a data budget's marks are samples seen).
    with pytest.raises(Paused) as exc:
        one_outcome([_record(r, Status.PAUSED, steps=3, paused_at=96) for r in (0, 1)])
    assert exc.value.step == 96
    # A rank that failed (its part of the checkpoint may be missing) fails the trial: it
    # cannot be promoted; so does a rank that never recorded how it ended.
    with pytest.raises(RunOutcome) as failed:
        one_outcome([paused[0], _record(1, Status.FAILED, error="peer gone")])
    assert not isinstance(failed.value, Paused) and failed.value.status == Status.FAILED
    with pytest.raises(RunOutcome, match=r"rank\(s\) \[1\] of 2 ended without a record"):
        one_outcome([paused[0]])
    # A prune, an OOM, a preemption still come first.
    with pytest.raises(RunOutcome) as pruned:
        one_outcome([paused[0], _record(1, Status.PRUNED, steps=3)])
    assert pruned.value.status == Status.PRUNED


def _sweep(tmp_path: Path, name: str, parallelism: str, pruner: str) -> optuna.Study:
    """A study of one trial (lr 0.01) as 2 ranks, in its own folder."""
    out = tmp_path / name
    result = procs.train(
        "-m",
        "hpo=optuna",
        # Dropout: the RNG state is part of the trajectory, so a resume that lost it (on any
        # rank) ends elsewhere. The only checkpoint is the pause's.
        *tiny(tmp_path, "model.dropout=0.1", "training.checkpoint_every=0"),
        "training.warmup_steps=0",
        f"training.parallelism={parallelism}",
        f"hpo.pruner={pruner}",
        "hpo.n_trials=1",
        "hpo.gpus_per_trial=2",
        "hpo.study_name=t",
        f"hpo.storage={out}/study.journal",
        f"hydra.sweep.dir={out}/multirun",
        "hpo.tensorboard=false",
        "hydra.sweeper.params={training.lr:'choice(0.01, 0.02)'}",
        "hpo.enqueue=[{training.lr:0.01}]",
        timeout=LAUNCH_TIMEOUT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "is already reported" not in result.stdout + result.stderr  # rank 0 reports once
    return optuna.load_study(study_name="t", storage=journal(f"{out}/study.journal"))


def _ranks(trial: optuna.trial.FrozenTrial) -> list[RankRecord]:
    return [RankRecord.read(record_path(trial.user_attrs["run_dir"], r)) for r in (0, 1)]


def _checkpoint(run_dir: Path, parallelism: str) -> list[str]:
    """What the pause wrote: one file of rank 0's (DDP), or a folder of both ranks' shards."""
    saved = Path(run_dir, "checkpoints")
    if parallelism == "ddp":
        return sorted(p.name for p in saved.iterdir())
    (folder,) = saved.iterdir()
    return [folder.name, *sorted(p.name for p in folder.glob("*.distcp"))]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("parallelism", "saved"),
    [
        ("ddp", ["step_00000003.pt"]),
        ("fsdp", ["step_00000003", "__0_0.distcp", "__1_0.distcp"]),
    ],
)
def test_a_promoted_two_rank_trial_resumes_on_both_ranks_and_ends_as_if_never_paused(
    tmp_path, parallelism, saved
):
    paused, promoted = _sweep(tmp_path, "asha", parallelism, "asha").get_trials()
    # Alone at its rung, the trial is paused there (fewer than 3 lines), as both ranks saw.
    assert paused.state == TrialState.PRUNED and paused.user_attrs["reason"] == "paused"
    assert paused.system_attrs[PAUSED] == RUNG
    assert [(r.status, r.steps, r.paused_at) for r in _ranks(paused)] == [
        ("paused", RUNG, RUNG)
    ] * 2
    assert _checkpoint(paused.user_attrs["run_dir"], parallelism) == saved
    # With the budget spent, the rung sends its best line on: both ranks resume at the rung.
    assert promoted.state == TrialState.COMPLETE
    assert promoted.user_attrs["resume_from"] == paused.user_attrs["run_dir"]
    assert [(r.status, r.resumed_from, r.steps) for r in _ranks(promoted)] == [
        ("completed", RUNG, 6)
    ] * 2
    assert Summary.read(promoted.user_attrs["run_dir"]).resumed_from_step == RUNG

    (straight,) = _sweep(tmp_path, "none", parallelism, "none").get_trials()
    assert straight.state == TrialState.COMPLETE and straight.params == paused.params
    assert [r.resumed_from for r in _ranks(straight)] == [0, 0]
    # Exactly: the same ranks, the same reduction order, the model, optimizer, schedule and
    # RNG state restored bit for bit: the same trajectory, the same float.
    assert promoted.value == straight.value
