"""A rank that stops answering inside a collective ends the run within training.peer_timeout_s.

Rank 1 of a 2-rank trial (gloo, CPU) stops answering before its forward of step 2
(`faults.hang_rank`); rank 0 waits for it in that phase's collective. With a 5 s bound the
trial ends on both ranks within the bound and a few seconds, FAIL with one line naming the
rank, the phase and the step, and the worker runs its next trial. No clock is asserted (a
shared machine's timings vary): the events say it, rank 0's timeout at the bound and the lost
rank's watcher ending it; the subprocess timeouts are the guard, without the bound the sweep
would wait for torch's 30 minutes. Plain torchrun
ends with the same line; the error that becomes it, and the trial's one outcome when several
ranks failed (the first to fail decides), are checked without processes.
"""

from __future__ import annotations

import optuna
import pytest
import torch
from optuna.trial import TrialState

from app.core.outcomes import RunOutcome, Status
from app.engine.comms.agreement import Agreement
from app.engine.comms.distributed import DistInfo
from app.engine.comms.peers import PeersLost, answering_peers
from app.engine.ranks import RankRecord, one_outcome, record_path
from hydra_plugins.hydratrain_optuna_sweeper._study._storage import journal
from tests import procs
from tests.conftest import TINY, tiny

pytestmark = pytest.mark.e2e

optuna.logging.set_verbosity(optuna.logging.WARNING)

BOUND_S = 5
LINE = f"rank 0 of 2: no answer from its peers within {BOUND_S}s in forward (step 2)"
HANG = ["faults.hang_rank=1", f"training.peer_timeout_s={BOUND_S}"]


@pytest.mark.slow
def test_a_rank_that_stops_answering_ends_its_trial_within_the_bound(tmp_path):
    result = procs.train(
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
    # ...by the bound, not a clock: rank 0's wait ended at the 5 s timeout (its line), and the
    # lost rank was ended by its watcher once rank 0 had recorded that (GRACE_S later), not by
    # the launcher's stop after SHUTDOWN_S.
    assert "rank 1: a peer ended the trial; this rank ends too" in result.stdout + result.stderr
    # The worker went on: its next trial trained on both ranks.
    assert done.state == TrialState.COMPLETE
    statuses = [RankRecord.read(record_path(done.user_attrs["run_dir"], r)).status for r in (0, 1)]
    assert statuses == ["completed"] * 2


@pytest.mark.slow
def test_a_torchrun_run_ends_with_the_same_line(tmp_path):
    """Plain torchrun: the waiting rank ends the run with the line and status 1; torchrun's
    agent then stops the lost rank (SIGTERM, SIGKILL 30 s later)."""
    args = [*TINY, f"data.cache_dir={tmp_path / 'cache'}", "faults.hang_step=2", *HANG]
    proc = procs.run(
        [
            *procs.TORCHRUN,
            "--nproc_per_node=2",
            "-m",
            "app.train",
            *args,
            f"hydra.run.dir={tmp_path}",
        ],
        env=procs.environment(OMP_NUM_THREADS="1"),
    )
    assert proc.returncode != 0
    assert f"error: {LINE}\n" in proc.stderr, proc.stderr[-3000:]


GLOO_TIMEOUT = "[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms for recv"
GLOO_GONE = "[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:13963."


def ended_in(agreement: Agreement | None, error: BaseException) -> BaseException:
    info = DistInfo(rank=1, world_size=4, timeout_s=2.5)
    with pytest.raises(BaseException) as caught, answering_peers(info, lambda: agreement):
        raise error
    return caught.value


def test_a_collective_error_becomes_one_line_with_the_phase_and_step():
    agreement = Agreement(rank=1)
    agreement.phase, agreement.step = "backward", 7
    lost = ended_in(agreement, RuntimeError(GLOO_TIMEOUT))
    assert isinstance(lost, PeersLost) and lost.status == Status.FAILED
    assert str(lost) == "rank 1 of 4: no answer from its peers within 2.5s in backward (step 7)"
    agreement.phase = "updated"  # after a phase with no collective of its own
    left = str(ended_in(agreement, RuntimeError(GLOO_GONE)))
    assert left.startswith("rank 1 of 4: its peers left after it updated (step 7): ")
    assert "while starting (step 0)" in str(ended_in(None, RuntimeError(GLOO_TIMEOUT)))


def test_other_errors_pass_unchanged():
    for error in (torch.OutOfMemoryError("CUDA out of memory"), RuntimeError("shape mismatch")):
        assert ended_in(Agreement(), error) is error


def test_the_first_failing_rank_decides_the_trial():
    def failed(rank: int, at: float, error: str) -> RankRecord:
        return RankRecord(rank, 2, rank, None, Status.FAILED.value, error=error, ended_at=at)

    first = "rank 1 of 2: no answer from its peers within 5s in forward (step 2)"
    records = [failed(0, 20.0, "its peers left in backward (step 2)"), failed(1, 10.0, first)]
    with pytest.raises(RunOutcome, match=r"^rank 1 of 2: no answer from its peers within 5s"):
        one_outcome(records)
