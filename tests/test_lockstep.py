"""Lockstep: workers take turns step by step; a dead or hung worker does not stall the rest."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from app.bench.throughput import lockstep, profiles, schedule
from app.bench.throughput.clock import StepClock

pytestmark = pytest.mark.e2e

# A worker: ready, then `steps` steps, each appending "<name> <step>" to a shared file.
WORKER = """
import sys
from app.bench.throughput.lockstep import Baton
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
    assert lane.start(argv, env=None) is False  # never said it was ready
    assert lane.finish() != 0  # killed: a worker left to sleep out its 60 s would exit 0


class FakeTime:
    """The clock StepClock reads: it moves only when the test says."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now


class CountingBaton:
    def __init__(self, clock: FakeTime) -> None:
        self.passes = 0
        self.clock = clock

    def pass_(self) -> None:
        self.passes += 1
        self.clock.now += 100.0  # the parent's other lanes: must not count as this worker's time


def test_step_clock_in_lockstep_times_only_its_own_turns(monkeypatch) -> None:
    import app.bench.throughput.clock as clock_module

    fake = FakeTime()
    monkeypatch.setattr(clock_module, "time", fake)
    baton = CountingBaton(fake)
    clock = StepClock(fake.time(), warmup=2, total=5, device=torch.device("cpu"), baton=baton)
    for _ in range(5):
        clock.before_step()
        fake.now += 10.0  # the step
        clock.step_done()
    assert baton.passes == 1 + 5  # ready, then after every step (the last waits for release)
    # 3 measured steps of 10 s each; the 100 s waits between turns are not in it.
    assert clock.measured_seconds() == 30.0
    assert clock.first_step_s == 10.0  # launch to ready (0 here), then its step: no wait
    assert clock.peak[1] == "peak_rss"


@pytest.mark.parametrize(("flag", "expected"), [(None, True), (True, True), (False, False)])
def test_lockstep_follows_the_flag_else_the_profile(flag, expected) -> None:
    import argparse

    args = argparse.Namespace(lockstep=flag)
    assert schedule._lockstep(args, profiles.PROFILES["tiny"]) is expected
    gpu = profiles.PROFILES["gpt2_small"]
    assert schedule._lockstep(argparse.Namespace(lockstep=None), gpu) is False
