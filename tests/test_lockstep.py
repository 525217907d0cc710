"""Lockstep: workers take turns step by step; a dead or hung worker does not stall the rest."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch

from app.bench import lockstep, profiles, schedule
from app.bench.clock import StepClock

# A worker: ready, then `steps` steps, each appending "<name> <step>" to a shared file.
WORKER = """
import sys
from app.bench.lockstep import Baton
go, done, name, steps, path, die_at = sys.argv[1:]
baton = Baton(int(go), int(done))
baton.pass_()
for step in range(int(steps)):
    if step == int(die_at):
        sys.exit(3)
    with open(path, "a") as f:
        f.write(f"{name} {step}\\n")
    baton.pass_()
"""


def _lanes(tmp_path: Path, names: list[str], steps: int, die: dict[str, int] | None = None):
    log = tmp_path / "steps.txt"
    lanes = []
    for name in names:
        lane = lockstep.Lane(name, tmp_path / f"{name}.log")
        go, done = lane.child_fds
        argv = [sys.executable, "-c", WORKER, str(go), str(done), name, str(steps), str(log)]
        argv.append(str((die or {}).get(name, -1)))
        assert lane.start(argv, env=None)
        lanes.append(lane)
    return lanes, log


def test_turns_interleave_steps_with_a_rotating_order(tmp_path: Path) -> None:
    lanes, log = _lanes(tmp_path, ["a", "b", "c"], steps=3)
    lockstep.run_turns(lanes, 3)
    assert [lane.finish() for lane in lanes] == [0, 0, 0]
    order = log.read_text().split("\n")[:-1]
    # Turn t: every lane does step t, and the lane that goes first rotates.
    assert order == ["a 0", "b 0", "c 0", "b 1", "c 1", "a 1", "c 2", "a 2", "b 2"]


def test_a_worker_that_dies_drops_out_and_the_others_finish(tmp_path: Path) -> None:
    lanes, log = _lanes(tmp_path, ["a", "b"], steps=3, die={"a": 1})
    lockstep.run_turns(lanes, 3)
    codes = [lane.finish() for lane in lanes]
    assert codes == [3, 0]
    assert log.read_text().split("\n")[:-1] == ["a 0", "b 0", "b 1", "b 2"]
    assert not lanes[0].alive


def test_a_hung_worker_is_killed_after_the_timeout(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(lockstep, "TURN_TIMEOUT_S", 0.5)
    lane = lockstep.Lane("hang", tmp_path / "hang.log")
    argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    t0 = time.monotonic()
    assert lane.start(argv, env=None) is False  # never said it was ready
    assert lane.finish() != 0
    assert time.monotonic() - t0 < 30


class CountingBaton:
    def __init__(self) -> None:
        self.passes = 0

    def pass_(self) -> None:
        self.passes += 1
        time.sleep(0.1)  # the parent's other lanes: must not count as this worker's time


def test_step_clock_in_lockstep_times_only_its_own_turns() -> None:
    baton = CountingBaton()
    clock = StepClock(time.time(), warmup=2, total=5, device=torch.device("cpu"), baton=baton)
    for _ in range(5):
        clock.before_step()
        time.sleep(0.01)  # the step
        clock.step_done()
    assert baton.passes == 1 + 5  # ready, then after every step (the last waits for release)
    # 3 measured steps of ~10 ms each; the 100 ms waits between turns (>= 0.3 s) are not in it.
    assert 0.03 <= clock.measured_seconds() < 0.25
    assert clock.first_step_s >= 0.01
    assert clock.peak[1] == "peak_rss"


@pytest.mark.parametrize(("flag", "expected"), [(None, True), (True, True), (False, False)])
def test_lockstep_follows_the_flag_else_the_profile(flag, expected) -> None:
    import argparse

    args = argparse.Namespace(lockstep=flag)
    assert schedule._lockstep(args, profiles.PROFILES["tiny"]) is expected
    gpu = profiles.PROFILES["gpt2_small"]
    assert schedule._lockstep(argparse.Namespace(lockstep=None), gpu) is False
