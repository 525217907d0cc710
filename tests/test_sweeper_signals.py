"""Signals and pauses, with the fake trainer (tests/fake_app): a worker paused past
hpo.stale_after comes back without a traceback, a preempted trial is re-queued and resumed by
the rerun, and SIGTERM reaching the sweeper itself stops the worker after its trial."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from hydra_plugins.hydratrain_optuna_sweeper._study._shared import counted
from hydra_plugins.hydratrain_optuna_sweeper._study._storage import journal
from tests import procs

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]
FAKE = [*procs.FAKE, "-m", "hpo=optuna"]
optuna.logging.set_verbosity(optuna.logging.WARNING)


def _args(tmp_path: Path, n: int, *extra: str) -> list[str]:
    return [
        f"hpo.n_trials={n}",
        "hpo.study_name=t",
        f"hpo.storage={tmp_path}/study.journal",
        f"hydra.sweep.dir={tmp_path}/multirun",
        "hpo.tensorboard=false",
        "hpo.pruner=none",
        "fake.step_sleep=0.3",  # 5 evaluations: 1.5 s a trial
        *extra,
    ]


def _start(tmp_path: Path, args: list[str]) -> subprocess.Popen:
    return procs.start([*FAKE, *args], env=procs.environment(out=tmp_path))


def _trials(tmp_path: Path) -> list[optuna.trial.FrozenTrial]:
    path = tmp_path / "study.journal"
    if not path.exists():
        return []
    try:
        return optuna.load_study(study_name="t", storage=journal(str(path))).get_trials()
    except KeyError:  # the study is not created yet
        return []


def _wait_for(tmp_path: Path, ready: Callable[[list], bool], timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if ready(_trials(tmp_path)):
            return
        time.sleep(0.1)
    raise AssertionError("the sweep never got there")


def _reporting(number: int) -> Callable[[list], bool]:
    return lambda ts: len(ts) > number and bool(ts[number].intermediate_values)


def test_a_worker_paused_past_stale_after_comes_back_without_a_traceback(tmp_path):
    args = _args(
        tmp_path, 4, "hpo.heartbeat_interval=0.2", "hpo.stale_after=1", "hpo.poll_interval=0.2"
    )
    paused = _start(tmp_path, args)
    _wait_for(tmp_path, _reporting(0))
    paused.send_signal(signal.SIGSTOP)  # a frozen VM, a long GC, Ctrl-Z
    other = _start(tmp_path, args)
    _other_out, other_err = other.communicate(timeout=120)
    assert other.returncode == 0, other_err[-2000:]
    paused.send_signal(signal.SIGCONT)
    out, err = paused.communicate(timeout=120)
    assert paused.returncode == 0, err[-2000:]
    assert "Traceback" not in out + err
    assert "Trial 0 was FAIL by another worker (stale) while this worker was away" in out
    trials = _trials(tmp_path)
    assert trials[0].state == TrialState.FAIL and trials[0].user_attrs["reason"] == "stale"
    assert sum(counted(t) for t in trials) == 4 and all(t.state.is_finished() for t in trials)
    assert "run_dir" not in trials[0].user_attrs  # the late result was dropped, not recorded


def test_a_preempted_trial_is_requeued_and_the_rerun_resumes_it(tmp_path):
    args = _args(tmp_path, 3)
    worker = _start(tmp_path, args)
    _wait_for(tmp_path, _reporting(1))
    worker.send_signal(signal.SIGTERM)  # what SLURM, Kubernetes and spot instances send
    _out, err = worker.communicate(timeout=60)
    assert worker.returncode == 128 + signal.SIGTERM, err[-2000:]
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("[")]  # Optuna's
    assert len(lines) == 1 and lines[0].startswith("stopped: SIGTERM: the worker recorded"), err
    trials = _trials(tmp_path)
    preempted = trials[1]
    assert preempted.state == TrialState.FAIL and preempted.user_attrs["reason"] == "preempted"
    assert not counted(preempted)
    assert len(trials) == 3 and trials[2].state == TrialState.WAITING  # its copy, queued

    rerun = _start(tmp_path, args)
    _, err = rerun.communicate(timeout=60)
    assert rerun.returncode == 0, err[-2000:]
    trials = _trials(tmp_path)
    retry = trials[2]
    assert retry.state == TrialState.COMPLETE and retry.params == preempted.params
    summary = json.loads(Path(retry.user_attrs["run_dir"], "summary.json").read_text())
    assert summary["resumed_from"] == preempted.user_attrs["run_dir"]  # training.resume=
    assert sum(counted(t) for t in trials) == 3 and all(t.state.is_finished() for t in trials)


def test_sigterm_to_the_sweeper_between_trials_stops_the_worker_cleanly(tmp_path):
    # fake.setup_sleep: the job has not taken SIGTERM over yet, so the sweeper's handler gets it
    args = _args(tmp_path, 3, "fake.setup_sleep=1.5", "fake.step_sleep=0.05")
    worker = _start(tmp_path, args)
    _wait_for(tmp_path, lambda ts: len(ts) == 1)
    started = tmp_path / "multirun" / "0" / ".hydra" / "config.yaml"  # the job has begun
    while not started.exists():
        time.sleep(0.05)
    time.sleep(0.3)  # and is in its set-up: a signal before it began would keep it from running
    worker.send_signal(signal.SIGTERM)
    out, err = worker.communicate(timeout=60)
    assert worker.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "Traceback" not in out + err
    assert "SIGTERM received: finishing the trials of this batch, then stopping" in out
    trials = _trials(tmp_path)
    assert [t.state for t in trials] == [TrialState.COMPLETE]  # its trial ended, no other began
    rerun = _start(tmp_path, args)
    assert rerun.wait(timeout=60) == 0
    assert [t.state for t in _trials(tmp_path)] == [TrialState.COMPLETE] * 3


# -- a stop is a stop, whatever happens to the trial's own save ---------------------------------


def _train_sweep(tmp_path: Path, *extra: str) -> subprocess.Popen:
    from tests.conftest import tiny

    cmd = [
        sys.executable, "-m", "app.train", "-m", "hpo=optuna",
        *tiny(tmp_path, "training.max_steps=100000", "training.eval_every=100000",
              "training.checkpoint_every=0"),
        "hpo.n_trials=3", "hpo.pruner=none", "hpo.study_name=t", "hpo.tensorboard=false",
        f"hpo.storage={tmp_path}/study.journal", f"hydra.sweep.dir={tmp_path}/multirun",
        *extra,
    ]  # fmt: skip
    return procs.start(cmd)


def test_a_stop_whose_trial_cannot_save_still_stops_the_sweep(tmp_path):
    """SIGTERM reaches a sweep whose trial's run dir is gone (a vanished scratch disk): the
    trial's stop checkpoint fails, the trial is failed with that reason, and the sweep stops
    there with the usual status and one line, launching no other trial."""
    sweep = _train_sweep(tmp_path)
    metrics = tmp_path / "multirun" / "0" / "metrics.jsonl"
    deadline = time.time() + 120
    while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        assert time.time() < deadline and sweep.poll() is None, "the trial never trained"
        time.sleep(0.1)
    run_dir = metrics.parent
    # Moved away in one step (a removal would race the trial's own writers, e.g. TensorBoard's
    # files appearing while the tree is removed), and a file in its place
    run_dir.rename(tmp_path / "gone")
    run_dir.write_text("not a directory any more")  # nothing can be written under it
    sweep.send_signal(signal.SIGTERM)
    try:
        _, err = sweep.communicate(timeout=120)
    finally:
        sweep.kill()  # a sweep that did not stop must not outlive the test
    assert sweep.returncode == 128 + signal.SIGTERM, err[-3000:]
    stopped = [line for line in err.splitlines() if line.startswith("stopped:")]
    assert len(stopped) == 1 and "SIGTERM" in stopped[0], err[-3000:]
    (trial,) = _trials(tmp_path)  # no trial was launched after the signal
    assert trial.state == TrialState.FAIL and trial.user_attrs["reason"] == "error"
    assert "WriteFailed" in trial.user_attrs["error"], trial.user_attrs


def test_a_stop_in_a_batch_runs_none_of_its_later_jobs_and_the_rerun_runs_them(tmp_path):
    """hydra.sweeper.n_jobs=3 with the basic launcher, which runs one job after another (one
    launch of 3, as the stock sweeper's): SIGTERM during the first job, and the other two end
    before the app runs, queued again with their parameters."""
    args = _args(tmp_path, 3, "hydra.sweeper.n_jobs=3", "fake.step_sleep=0.3")
    worker = _start(tmp_path, args)
    _wait_for(tmp_path, _reporting(0))
    worker.send_signal(signal.SIGTERM)
    out, err = worker.communicate(timeout=60)
    assert worker.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "Launching 3 jobs locally" in out
    trials = _trials(tmp_path)
    assert [t.intermediate_values for t in trials[1:3]] == [{}, {}]  # they never trained
    assert "before this trial started" in trials[1].user_attrs["error"]
    first, later = trials[0], [t for t in trials[1:] if counted(t)]
    assert first.user_attrs["reason"] == "preempted"  # it took the signal itself: resumable
    assert [t.state for t in later] == [TrialState.WAITING] * 3  # its copy and the two others
    rerun = _start(tmp_path, args)
    assert rerun.wait(timeout=60) == 0
    done = [t for t in _trials(tmp_path) if t.state == TrialState.COMPLETE]
    assert len(done) == 3
