"""hpo.trials_per_gpu=auto: trials share a GPU as far as their measured peak memory allows.

Unit tests of the sizing rule, the ledger and the memory cap; then fleets of the fake trainer
(tests/fake_app) on two fake GPUs (hpo.devices=[0,1] fakes CUDA_VISIBLE_DEVICES,
hpo.gpu_memory_gib fakes each GPU's memory, fake.peak_memory_bytes is what each trial records
as its peak). Held trials (fake.hold_from..hold_below) keep their seats until the test
releases them: the test reads how many run at once, and who waits, from the study and the
ledger, never from the clock."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
import torch
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from app.components.hardware.devices import DeviceInfo, cap_process_memory
from app.components.hardware.sharing import SharedGpu, shared_gpu
from app.engine.batch.memory import MemoryMeter
from app.engine.records.summary import Summary
from hydra_plugins.hydratrain_optuna_sweeper._errors import SweepConfigError
from hydra_plugins.hydratrain_optuna_sweeper._fleet._gpu_share import (
    GpuShare,
    Ledger,
    Seat,
    reservation,
)
from hydra_plugins.hydratrain_optuna_sweeper._study._fleet_plan import FleetAsk, plan_fleet
from hydra_plugins.hydratrain_optuna_sweeper._study._space import largest_point
from tests.test_fleet import _args, _no_stray_processes, _start, _trials, _wait_for

pytestmark = pytest.mark.e2e

__all__ = ["_no_stray_processes"]  # the fleet tests' clean-up runs after these too

GIB = 2**30
GPU = SharedGpu("0", "fake", 10 * GIB, 0.1)  # 9 GiB usable


def test_a_trial_reserves_the_largest_measured_peak_plus_the_headroom():
    assert reservation([], GPU) == 10 * GIB  # nothing measured: the whole GPU, alone
    assert reservation([GIB, int(2.7 * GIB), 2 * GIB], GPU) == pytest.approx(3 * GIB, abs=1)
    assert reservation([20 * GIB], GPU) == 10 * GIB  # never more than the GPU


def test_the_ledger_seats_what_fits_and_lists_who_waits(tmp_path):
    ledger = Ledger(tmp_path, "0")
    me = Ledger(tmp_path, "0").host
    alive = [subprocess.Popen([sys.executable, "-c", "input()"], stdin=subprocess.PIPE)
             for _ in range(4)]  # fmt: skip
    try:
        need = reservation([int(2.5 * GIB)], GPU)  # 2.78 GiB: three fit in 10, four do not
        for p in alive[:3]:
            assert ledger.take(Seat(me, p.pid, need), GPU.memory_bytes) is not None
        assert ledger.take(Seat(me, alive[3].pid, need), GPU.memory_bytes) is None
        book = ledger.read()
        assert len(book.seats) == 3 and [s.pid for s in book.waiting] == [alive[3].pid]
        ledger.leave(alive[0].pid)
        seats = ledger.take(Seat(me, alive[3].pid, need), GPU.memory_bytes)
        assert seats is not None and len(seats) == 3 and not ledger.read().waiting
        ledger.name_trial(alive[3].pid, 7)
        assert [s.trial for s in ledger.read().seats] == [None, None, 7]
    finally:
        for p in alive:
            p.kill()
            p.wait()
    # Every seat's worker has ended: its seats are free; another host's are not this one's
    assert ledger.read().seats == []
    elsewhere = Seat("another-host", 1, 6 * GIB)
    assert ledger.take(elsewhere, GPU.memory_bytes) is not None
    assert ledger.take(Seat(me, 2**22, 6 * GIB), GPU.memory_bytes) is None


def test_an_empty_gpu_seats_even_a_trial_larger_than_itself(tmp_path):
    seats = Ledger(tmp_path, "1").take(Seat("h", 1, 11 * GIB), 10 * GIB)
    assert seats is not None and len(seats) == 1


def test_trials_per_gpu_auto_seats_max_trials_per_gpu_workers_on_each_gpu():
    ask = FleetAsk.of("auto", [0, 1], 1, "auto", 3, 24)
    assert ask.trials_per_gpu is None and ask.gpu_memory_gib == 24.0
    plan = plan_fleet(ask, [])
    assert plan.workers == 6 and plan.devices == (("0",), ("1",)) * 3
    assert "trials per GPU: auto (from measured peak memory, at most 3)" in plan.describe()
    with pytest.raises(SweepConfigError, match=r"hpo\.max_trials_per_gpu=3 per group"):
        plan_fleet(FleetAsk.of(7, [0, 1], 1, "auto", 3), [])


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ((1, None, 1, "foo"), "hpo.trials_per_gpu='foo' is not allowed; allowed: auto or a"),
        ((1, None, 1, "auto", 0), "hpo.max_trials_per_gpu=0 is not allowed"),
        ((1, None, 1, "auto", 4, -1), "hpo.gpu_memory_gib=-1 is not allowed"),
    ],
)
def test_bad_sharing_settings_are_one_line(args, needle):
    with pytest.raises(SweepConfigError, match=needle.replace("(", r"\(")):
        FleetAsk.of(*args)


def test_a_gpu_without_nvml_needs_its_memory_named():
    with pytest.raises(Exception, match=r"hpo\.gpu_memory_gib=<GiB of each GPU>"):
        shared_gpu("0", {}, None)
    assert shared_gpu("0", {"device_type": "cuda", "memory_headroom": 0.2}, 8).headroom == 0.2


def test_a_capped_run_measures_against_its_cap_and_says_so(monkeypatch):
    """gpu.memory_limit_gib: the probe's fractions are of the cap, and what the neighbours
    hold within the rest of the card is not counted against it (CUDA faked)."""
    card, free, mine = 80 * GIB, 50 * GIB, 2 * GIB  # neighbours hold 28 GiB
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d: (free, card))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d: mine)
    capped = DeviceInfo("cuda", "H100", total_memory_bytes=card, memory_limit_bytes=20 * GIB)
    meter = MemoryMeter(capped)
    assert (meter.total, meter.elsewhere) == (20 * GIB, 0)
    squeezed = DeviceInfo("cuda", "H100", total_memory_bytes=card, memory_limit_bytes=60 * GIB)
    assert MemoryMeter(squeezed).elsewhere == 8 * GIB  # 28 held where 20 were left to them
    whole = MemoryMeter(DeviceInfo("cuda", "H100", total_memory_bytes=card))
    assert (whole.total, whole.elsewhere) == (card, 28 * GIB)
    line = Summary(device="cuda", device_name="H100", device_memory_bytes=card,
                   memory_limit_bytes=20 * GIB, preset="h100").device_line()  # fmt: skip
    assert line.endswith("80.0 GiB, this run capped at 20.00 GiB (shared) (preset h100)")


def test_the_cap_holds_the_process_to_a_fraction_of_its_card(monkeypatch):
    calls = []
    monkeypatch.setattr(
        torch.cuda, "set_per_process_memory_fraction", lambda f, i: calls.append((f, i))
    )
    assert cap_process_memory(1, 20.0, 80 * GIB) == 20 * GIB
    assert cap_process_memory(0, 100.0, 80 * GIB) == 80 * GIB  # never more than the card
    assert calls == [(0.25, 1), (1.0, 0)]


def test_a_trial_of_several_ranks_records_its_largest_ranks_peak():
    assert Summary(peak_memory_bytes=5, peak_memory_bytes_per_rank=[5, 9]).largest_peak_bytes == 9
    assert Summary(peak_memory_bytes=5).largest_peak_bytes == 5


def test_the_largest_point_takes_each_numeric_parameter_at_its_largest_value():
    space = {
        "training.effective_batch_size": CategoricalDistribution([16, 64, 32]),
        "training.lr": FloatDistribution(1e-4, 1e-2, log=True),
        "data.seq_len": IntDistribution(64, 512, step=64),
        "model.arch": CategoricalDistribution(["gpt2", "llama"]),  # left to the sampler
    }
    assert largest_point(space) == {
        "training.effective_batch_size": 64,
        "training.lr": 1e-2,
        "data.seq_len": 512,
    }


def test_a_share_describes_itself_and_caps_its_trial_below_its_reservation():
    share = GpuShare("0", 3, reservation([int(2.5 * GIB)], GPU), GPU.memory_bytes, 0.1, 5)
    assert share.describe().startswith("3 trial(s) on devices 0: 2.78 of 10.00 GiB")
    assert share.cap_gib() * GIB <= share.reserved_bytes < (share.cap_gib() + 1e-4) * GIB
    assert share.attrs()["gpu_share"]["trials"] == 3


# ---------------------------------------------------------------------------------------------
# Fleets of the fake trainer on two fake GPUs


def _sharing(tmp_path: Path, n: int, most: int, peak_gib: float, *extra: str) -> list[str]:
    return _args(
        tmp_path,
        n,
        "hpo.workers=auto",
        "hpo.devices=[0,1]",
        "hpo.trials_per_gpu=auto",
        f"hpo.max_trials_per_gpu={most}",
        "hpo.gpu_memory_gib=10",  # gpu.memory_headroom=0.1 (the fake's preset): 9 GiB usable
        f"fake.peak_memory_bytes={int(peak_gib * GIB)}",
        *extra,
    )


def _book(tmp_path: Path, device: str) -> dict[str, list[dict[str, object]]]:
    path = tmp_path / "multirun" / "gpus" / f"{socket.gethostname()}_{device}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {"seats": [], "waiting": []}


def _full(tmp_path: Path, seated: int) -> bool:
    """Each fake GPU has `seated` trials running and a worker refused a seat beside them."""
    books = [_book(tmp_path, d) for d in ("0", "1")]
    return all(len(b["seats"]) == seated and b["waiting"] for b in books)


def _at_most(trials: list[FrozenTrial], n: int) -> bool:
    """No fake GPU runs more than `n` trials in this look at the study."""
    for device in ("0", "1"):
        on_it = [t for t in trials if t.user_attrs.get("devices") == device]
        running = [t.number for t in on_it if t.state == TrialState.RUNNING]
        assert len(running) <= n, f"trials {running} run at once on device {device}"
    return True


def _most_at_once(trials: list[FrozenTrial], device: str) -> int:
    """The most trials of `device` running at once, from the study's own times: each trial
    was asked after its worker took a seat and told before the worker gave it back."""
    edges: list[tuple[datetime, int]] = []
    for t in trials:
        if t.user_attrs.get("devices") == device:
            assert t.datetime_start is not None and t.datetime_complete is not None
            edges += [(t.datetime_start, 1), (t.datetime_complete, -1)]
    running = most = 0
    for _, step in sorted(edges):  # an end before a start at the same instant
        running += step
        most = max(most, running)
    return most


def _finish(tmp_path: Path, parent: subprocess.Popen, n: int, most: int) -> list[FrozenTrial]:
    (tmp_path / "release").touch()
    out, err = parent.communicate(timeout=300)
    assert parent.returncode == 0, err[-2000:]
    assert f"trials per GPU: auto (from measured peak memory, at most {most})" in out
    trials = _trials(tmp_path)
    assert len(trials) == n and all(t.state == TrialState.COMPLETE for t in trials)
    return trials


@pytest.mark.slow
def test_trials_that_fit_three_to_a_gpu_run_three_at_once_on_each_and_never_four(tmp_path):
    # 2.5 GiB peaks reserve 2.78 GiB each: three fit in a 10 GiB GPU, four do not. Trials 0
    # and 1 are measured first; 2..7 hold their seats until released.
    args = _sharing(tmp_path, 10, 4, 2.5, "fake.hold_from=2", "fake.hold_below=8")
    parent = _start(tmp_path, args)
    holding = [tmp_path / f"release.{n}.holding" for n in range(2, 8)]
    _wait_for(tmp_path, lambda ts: _at_most(ts, 3) and all(p.exists() for p in holding)
              and _full(tmp_path, 3), parent)  # fmt: skip
    running = [t for t in _trials(tmp_path) if t.state == TrialState.RUNNING]
    assert sorted(t.number for t in running) == list(range(2, 8))
    for device in ("0", "1"):
        on_it = [t for t in running if t.user_attrs["devices"] == device]
        assert len(on_it) == 3 and max(t.user_attrs["gpu_share"]["trials"] for t in on_it) == 3
    trials = _finish(tmp_path, parent, 10, 4)
    assert [_most_at_once(trials, d) for d in ("0", "1")] == [3, 3]
    # The first trial was the search space's largest point, measured alone.
    assert trials[0].params == largest_point(trials[0].distributions)
    assert trials[0].params["training.effective_batch_size"] == 64
    for t in trials[2:8]:
        share = t.user_attrs["gpu_share"]
        assert share["peak_bytes"] == int(2.5 * GIB) and share["trials"] <= 3
        summary = json.loads(Path(t.user_attrs["run_dir"], "summary.json").read_text())
        assert summary["memory_limit_gib"] * GIB <= share["reserved_bytes"] < 3 * GIB


@pytest.mark.slow
def test_a_trial_that_fits_only_alone_runs_alone_on_its_gpu(tmp_path):
    # 6 GiB peaks reserve 6.67 GiB: two never fit in 10. Trials 2 and 3 hold their GPUs.
    args = _sharing(tmp_path, 6, 2, 6.0, "fake.hold_from=2", "fake.hold_below=4")
    parent = _start(tmp_path, args)
    holding = [tmp_path / f"release.{n}.holding" for n in (2, 3)]
    _wait_for(tmp_path, lambda ts: _at_most(ts, 1) and all(p.exists() for p in holding)
              and _full(tmp_path, 1), parent)  # fmt: skip
    trials = _finish(tmp_path, parent, 6, 2)
    assert [_most_at_once(trials, d) for d in ("0", "1")] == [1, 1]
    assert all(t.user_attrs["gpu_share"]["trials"] == 1 for t in trials)
