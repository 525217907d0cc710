"""SIGTERM/SIGINT: the run finishes its step, checkpoints, says `preempted`, and resumes exactly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from app.core.preemption import StopRequest, stop_on_signals
from app.engine.records.summary import Summary
from app.engine.saving import checkpoint as ckpt
from tests import procs
from tests.conftest import ROOT, tiny

pytestmark = pytest.mark.e2e

# Long enough that the signal lands mid-run; dropout makes the RNG state part of the trajectory.
LONG = ("training.max_steps=400", "training.checkpoint_every=0", "model.dropout=0.1")


def _start(tmp_path: Path, run: str, *extra: str) -> subprocess.Popen:
    args = [*tiny(tmp_path, *LONG), f"hydra.run.dir={tmp_path / run}", *extra]
    return procs.start([*procs.TRAIN, *args])


def _wait_for_step(run_dir: Path, step: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        if metrics.is_file() and any(
            json.loads(line).get("step", 0) >= step for line in metrics.read_text().splitlines()
        ):
            return
        time.sleep(0.05)
    raise AssertionError(f"step {step} not reached")


def _final_model(run_dir: Path) -> dict[str, torch.Tensor]:
    last = ckpt.list_checkpoints(run_dir / "checkpoints")[-1]
    return torch.load(last, weights_only=True)["model"]


@pytest.mark.slow
def test_sigterm_mid_run_checkpoints_and_the_resumed_run_matches_an_uninterrupted_one(tmp_path):
    straight = _start(tmp_path, "straight")
    preempted = _start(tmp_path, "preempted")
    _wait_for_step(tmp_path / "preempted", 20, preempted)
    preempted.send_signal(signal.SIGTERM)
    _, err = preempted.communicate(timeout=120)
    assert preempted.returncode == 128 + signal.SIGTERM, err
    assert [ln for ln in err.splitlines() if ln.startswith(("stopped:", "error:"))] == [
        err.strip().splitlines()[-1]
    ]
    assert "Traceback" not in err
    summary = Summary.read(tmp_path / "preempted")
    assert summary.status == "preempted"
    stopped_at = summary.steps
    assert 20 <= stopped_at < 400
    saved = ckpt.list_checkpoints(tmp_path / "preempted" / "checkpoints")
    assert [int(p.stem.split("_")[1]) for p in saved] == [stopped_at]

    resumed = subprocess.run(
        [
            sys.executable,
            "-m",
            "app.train",
            *tiny(tmp_path, *LONG),
            f"hydra.run.dir={tmp_path / 'preempted'}",
            "training.resume=auto",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert straight.wait(timeout=300) == 0
    after = Summary.read(tmp_path / "preempted")
    assert after.status == "completed" and after.resumed_from_step == stopped_at
    a, b = _final_model(tmp_path / "straight"), _final_model(tmp_path / "preempted")
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=0, msg=name)


@pytest.mark.slow
def test_a_second_signal_ends_the_process_at_once(tmp_path):
    proc = _start(tmp_path, "run", "training.eval_every=1000")
    _wait_for_step(tmp_path / "run", 5, proc)
    # A handler that never returns would let the second signal go unanswered: it must kill.
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode in (-signal.SIGINT, 128 + signal.SIGINT)


def test_the_handlers_are_restored_after_the_run():
    before = signal.getsignal(signal.SIGTERM)
    stop = StopRequest()
    with stop_on_signals(stop):
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 5
        while not stop.requested and time.monotonic() < deadline:
            time.sleep(0.01)
    assert stop.requested and stop.name == "SIGTERM" and stop.exit_status == 143
    assert signal.getsignal(signal.SIGTERM) is before
