"""A fleet of workers on one study (`hpo.workers`), with the fake trainer (tests/fake_app):
two processes pinned to their own (fake) devices, no barrier between them, a worker killed
mid-trial, SIGTERM to the parent, and the same fleet as jobs of Hydra's launchers.

Trials numbered below `fake.hold_below` wait for `fake.release_file`: the tests order events
by what the study says, never by the clock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

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
        "hpo.poll_interval=0.2",
        f"fake.release_file={tmp_path}/release",
        *extra,
    ]


@pytest.fixture(autouse=True)
def _no_stray_processes(tmp_path):
    """A failed test leaves no fleet behind: held trials are released, the parent stopped
    (it passes SIGTERM on to its workers)."""
    started: list[subprocess.Popen] = []
    _STARTED.append(started)
    yield
    _STARTED.remove(started)
    (tmp_path / "release").touch()
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


_STARTED: list[list[subprocess.Popen]] = []


def _start(tmp_path: Path, args: list[str]) -> subprocess.Popen:
    proc = procs.start([*FAKE, *args], env=procs.environment(out=tmp_path))
    _STARTED[-1].append(proc)
    return proc


def _trials(tmp_path: Path) -> list[FrozenTrial]:
    path = tmp_path / "study.journal"
    if not path.exists():
        return []
    try:
        return optuna.load_study(study_name="t", storage=journal(str(path))).get_trials()
    except KeyError:  # the study is not created yet
        return []


def _wait_for(tmp_path: Path, ready: Callable[[list[FrozenTrial]], bool], proc=None) -> None:
    deadline = time.time() + 120
    while time.time() < deadline:
        if ready(_trials(tmp_path)):
            return
        if proc is not None and proc.poll() is not None:
            _out, err = proc.communicate()
            raise AssertionError(f"the sweep ended first ({proc.returncode}): {err[-2000:]}")
        time.sleep(0.1)
    raise AssertionError("the sweep never got there")


def _running(t: FrozenTrial) -> bool:
    return t.state == TrialState.RUNNING and "worker_pid" in t.user_attrs


def _budget_spent(trials: list[FrozenTrial], n: int) -> bool:
    done = [t for t in trials if counted(t)]
    return len(done) == n and all(t.state == TrialState.COMPLETE for t in done)


def test_two_workers_on_their_own_devices_run_trials_with_no_barrier(tmp_path):
    parent = _start(tmp_path, _args(tmp_path, 4, "hpo.workers=2", "hpo.devices=[0,1]",
                                    "fake.hold_below=1"))  # fmt: skip
    # Trial 0 holds its worker; the other worker must go on through 1, 2 and 3 meanwhile.
    _wait_for(tmp_path, lambda ts: len(ts) == 4 and _running(ts[0])
              and all(t.state == TrialState.COMPLETE for t in ts[1:]), parent)  # fmt: skip
    (tmp_path / "release").touch()
    out, err = parent.communicate(timeout=120)
    assert parent.returncode == 0, err[-2000:]
    trials = _trials(tmp_path)
    assert _budget_spent(trials, 4) and len(trials) == 4
    held, rest = trials[0], trials[1:]
    assert {t.user_attrs["worker"] for t in rest} == {1 - held.user_attrs["worker"]}
    assert all(t.datetime_complete < held.datetime_complete for t in rest)  # no barrier
    for t in trials:  # each trial ran pinned to its worker's device, as the worker saw it
        summary = json.loads(Path(t.user_attrs["run_dir"], "summary.json").read_text())
        assert t.user_attrs["devices"] == summary["devices"] == str(t.user_attrs["worker"])
        assert t.user_attrs["host"] and t.user_attrs["worker_pid"] != parent.pid
    lines = [ln for ln in out.splitlines() if "] Trial " in ln]
    assert len(lines) == 4 and all("COMPLETE" in ln and "(devices " in ln for ln in lines)
    assert "Fleet: 2 workers (devices 0: 0, 1: 1)" in out
    # The workers start before the parent checks the space and opens the study: their
    # start-up runs beside the parent's, not after it.
    said = [ln.split("][HYDRA] ", 1)[-1] for ln in out.splitlines()]
    started = [i for i, x in enumerate(said) if x.startswith("Started worker ")]
    prepared = [i for i, x in enumerate(said) if x.startswith("Study t in ")]
    assert len(started) == 2 and len(prepared) == 1 and max(started) < prepared[0]
    rows = {"worker 0 (GPU 0)", "worker 1 (GPU 1)"}
    _assert_one_report_with_a_row_per_worker(tmp_path, out, rows)


def _assert_one_report_with_a_row_per_worker(tmp_path: Path, out: str, rows: set[str]) -> None:
    """The fleet's parent writes the report, once, after its workers; its timeline has a row
    per worker and device."""
    from app.studies.report.figures import timeline
    from hydra_plugins.hydratrain_optuna_sweeper._report._records import study_record

    report = tmp_path / "multirun" / "report.html"
    assert out.strip().splitlines()[-1].endswith(f"Report in {report}")
    logs = list((tmp_path / "multirun" / "workers").glob("worker_*.log"))
    assert len(logs) == 2 and not any("Report in" in log.read_text() for log in logs)
    study = optuna.load_study(study_name="t", storage=journal(str(tmp_path / "study.journal")))
    figure = timeline(study_record(study, "journal"), study)
    assert {row for trace in figure.data for row in trace.y} == rows
    assert "<section id='timeline' data-drawn=\"true\">" in report.read_text()


def test_a_bad_setting_found_after_the_workers_started_stops_them(tmp_path):
    """The workers start before the parent checks the search space: a bad one ends the
    parent as a lone worker's would (one line, status 2, no study), with its workers stopped
    and waited for, not left to fail on their own."""
    bad = "hydra.sweeper.params={training.lr:'interval(1, nope)'}"
    parent = _start(tmp_path, _args(tmp_path, 2, "hpo.workers=2", bad))
    out, err = parent.communicate(timeout=120)
    assert parent.returncode == 2, err[-2000:]
    assert err.strip().splitlines() == [err.strip().splitlines()[-1]]
    assert err.startswith("error: hydra.sweeper.params.training.lr=interval(1, nope)")
    assert not (tmp_path / "study.journal").exists()
    pids = [int(ln.split(": pid ")[1].split(",")[0]) for ln in out.splitlines() if ": pid " in ln]
    assert len(pids) == 2
    for pid in pids:  # ended and reaped by the parent before it exited
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_the_sweeper_starts_without_torch():
    """A fleet's parent starts its workers once the sweeper is set up: importing torch first
    (seconds on a CPU) would delay every worker by as much."""
    code = (
        "import sys, hydra_plugins.hydratrain_optuna_sweeper._sweep._plan; "
        "print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.stdout.strip() == "False", done.stderr[-2000:]


def test_the_fleet_parent_loads_the_reports_imports_while_its_workers_run():
    """The parent writes report.html when its last worker ended: what drawing it imports
    (plotly, Optuna's plots, matplotlib) is loaded while it waits, not after."""
    code = (
        "import sys, threading; "
        "from hydra_plugins.hydratrain_optuna_sweeper._fleet import _local as _fleet; "
        "from unittest import mock; "
        "fleet = _fleet.LocalFleet.__new__(_fleet.LocalFleet); fleet.since = None; "
        "fleet._watch = lambda study, ticker: [t.join() for t in threading.enumerate() "
        "if t.name == 'hpo-report-preload']; fleet._status = lambda: 0; "
        "_fleet.TrialTicker = mock.MagicMock(); fleet.watch(None); "
        "print(all(m in sys.modules for m in ('plotly.graph_objects', 'optuna.visualization', "
        "'matplotlib.pyplot')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.stdout.strip() == "True", done.stderr[-2000:]


def test_a_fleet_worker_leaves_its_heap_to_the_exit(tmp_path):
    """The parent waits for its workers' ends: a worker ends its sweep with its objects frozen
    out of the interpreter's last garbage collection (gc.freeze), which would otherwise walk
    every object torch and transformers made."""
    script = str(ROOT / "tests" / "fake_app" / "fake_train.py")
    code = (
        "import atexit, gc, runpy, sys; "
        "atexit.register(lambda: print('frozen:', gc.get_freeze_count() > 0)); "
        f"sys.argv = [{script!r}, *sys.argv[1:]]; runpy.run_path({script!r}, run_name='__main__')"
    )
    env = {**os.environ, "FAKE_OUT": str(tmp_path), "PYTHONPATH": str(ROOT)}
    args = ["-m", "hpo=optuna", *_args(tmp_path, 1)]
    for worker, frozen in ((None, "False"), ("0", "True")):  # a lone worker: as before
        if worker is not None:
            env["HYDRATRAIN_FLEET_WORKER"] = worker
        done = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip().splitlines()[-1] == f"frozen: {frozen}"


def test_a_worker_killed_mid_trial_leaves_the_budget_to_the_other(tmp_path):
    # stale_after: longer than the test waits; the parent fails the trial the moment its
    # worker is gone, not when its heartbeat is overdue.
    args = _args(tmp_path, 3, "hpo.workers=2", "hpo.retry_stale=1", "hpo.stale_after=600",
                 "fake.hold_below=1")  # fmt: skip
    parent = _start(tmp_path, args)
    _wait_for(tmp_path, lambda ts: bool(ts) and _running(ts[0]), parent)
    victim = _trials(tmp_path)[0].user_attrs["worker_pid"]
    os.kill(victim, signal.SIGKILL)
    _out, err = parent.communicate(timeout=120)
    assert parent.returncode == 1, err[-2000:]
    assert "error: 1 of 2 workers did not end cleanly" in err and "killed by SIGKILL" in err
    trials = _trials(tmp_path)
    stale = trials[0]
    assert stale.state == TrialState.FAIL and stale.user_attrs["reason"] == "stale"
    assert "killed by SIGKILL" in stale.user_attrs["error"] and not counted(stale)
    retry = next(t for t in trials if t.system_attrs.get("failed_trial") == 0)
    assert retry.state == TrialState.COMPLETE and retry.params == stale.params
    assert retry.user_attrs["worker_pid"] != victim
    assert _budget_spent(trials, 3)


def test_sigterm_to_the_parent_preempts_every_worker_and_the_command_resumes(tmp_path):
    args = _args(tmp_path, 4, "hpo.workers=2", "fake.hold_below=2")
    parent = _start(tmp_path, args)
    holding = [tmp_path / f"release.{n}.holding" for n in (0, 1)]
    _wait_for(tmp_path, lambda ts: all(p.exists() for p in holding), parent)  # both mid-trial
    parent.send_signal(signal.SIGTERM)
    _out, err = parent.communicate(timeout=120)
    assert parent.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("stopped: SIGTERM: every worker recorded")
    trials = _trials(tmp_path)
    for t in trials[:2]:  # each worker preempted its trial and queued it again
        assert t.state == TrialState.FAIL and t.user_attrs["reason"] == "preempted"
    assert [t.state for t in trials[2:]] == [TrialState.WAITING] * 2
    html = (tmp_path / "multirun" / "report.html").read_text()  # the stopped sweep's too
    assert html.count("<td>preempted</td><td>preempted</td>") == 2

    rerun = _start(tmp_path, args)  # the same command
    _out, err = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, err[-2000:]
    trials = _trials(tmp_path)
    assert _budget_spent(trials, 4)
    resumed = [t for t in trials if t.system_attrs.get("failed_trial") in (0, 1)]
    assert len(resumed) == 2 and all(t.state == TrialState.COMPLETE for t in resumed)


@pytest.mark.parametrize("launcher", ["submitit_local", "joblib"])
def test_a_launcher_runs_the_fleet_as_long_lived_worker_jobs(tmp_path, launcher):
    pytest.importorskip(f"hydra_plugins.hydra_{launcher.split('_')[0]}_launcher")
    parent = _start(tmp_path, _args(tmp_path, 6, "hpo.workers=2", "hpo.devices=[0,1]",
                                    f"hydra/launcher={launcher}"))  # fmt: skip
    out, err = parent.communicate(timeout=300)
    assert parent.returncode == 0, err[-2000:]
    trials = _trials(tmp_path)
    assert _budget_spent(trials, 6) and len(trials) == 6
    by_worker = {t.user_attrs["worker"]: set() for t in trials}
    for t in trials:
        by_worker[t.user_attrs["worker"]].add(t.user_attrs["worker_pid"])
        assert t.user_attrs["devices"] == str(t.user_attrs["worker"])
    # Two jobs, each one process that ran trial after trial: not a job per trial.
    assert set(by_worker) == {0, 1} and all(len(p) == 1 for p in by_worker.values())
    assert parent.pid not in {p for pids in by_worker.values() for p in pids}
    if launcher == "submitit_local":
        jobs = [p for p in (tmp_path / "multirun" / ".submitit").iterdir() if p.name.isdigit()]
        assert len(jobs) == 2
    else:
        assert "is launching 2 jobs" in out
