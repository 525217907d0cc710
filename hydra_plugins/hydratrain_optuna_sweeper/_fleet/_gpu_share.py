"""hpo.trials_per_gpu=auto: how many trials share a GPU, decided from measured peak memory each
time a worker is about to ask for a trial (docs/scaling.md, "A node, a cluster").

The workers seated on one GPU (or one group of a multi-rank trial's GPUs) keep a ledger,
<sweep dir>/gpus/<host>_<devices>.json, under a file lock: one seat per worker that runs a
trial there, with the bytes it reserved, and the workers waiting for room. A worker asks the
study for a trial only once its reservation fits beside the seats taken, and gives the seat
back when the trial was told (whatever way it ended). The seat of a worker process that
died is dropped when the ledger is read.

A trial reserves the largest peak memory the study's trials have recorded so far (the trial
attribute peak_memory_bytes; several ranks: the largest rank's) plus the gpu preset's
memory_headroom of it, which is the room the batch probe keeps free: trials fit on a GPU
while their peaks add up to at most (1 - memory_headroom) of its memory. Before any trial
is measured a trial reserves the whole GPU, so the first runs alone and is measured; a new
study's first trial is the search space's largest point (`_space.largest_point`). The
trial's process is held to its reservation (gpu.memory_limit_gib): a trial larger than the
bound runs out of memory in its own process, and is recovered or pruned as on a full card,
rather than taking a neighbour's memory. The probe cache is not read: its key (the built
model, the device) is known only inside the trial.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import optuna
from omegaconf import OmegaConf

from app.components.hardware.sharing import SharedGpu, shared_gpu
from app.core.atomic import atomic_write_text
from app.core.errors import ConfigError

from .._errors import SweepConfigError
from .._study._fleet_plan import DEVICES_ENV, FleetAsk, FleetPlan, fleet_worker
from .._study._shared import budget_lock

log = logging.getLogger(__name__)
GIB = 2**30
PEAK = "peak_memory_bytes"  # the trial attribute a run records its peak memory in


@dataclass(frozen=True)
class Seat:
    """One worker's reservation on a GPU."""

    host: str
    pid: int
    bytes: int
    trial: int | None = None  # the trial it runs, once asked


@dataclass(frozen=True)
class GpuShare:
    """How a trial's GPU was shared when it started: recorded on the trial (`gpu_share`)."""

    devices: str
    trials: int  # running on the GPU, this one included
    reserved_bytes: int  # this trial's reservation, and its process's memory cap
    memory_bytes: int  # the GPU's (hpo.gpu_memory_gib, or the card's)
    headroom: float  # the gpu preset's memory_headroom
    peak_bytes: int | None  # the largest measured peak it was sized from; None: none yet

    def describe(self) -> str:
        bound = (
            f"largest measured peak {self.peak_bytes / GIB:.2f} GiB + {self.headroom:.0%}"
            if self.peak_bytes is not None
            else "nothing measured yet: the whole GPU"
        )
        return (
            f"{self.trials} trial(s) on devices {self.devices}: {self.reserved_bytes / GIB:.2f} "
            f"of {self.memory_bytes / GIB:.2f} GiB reserved by this one ({bound})"
        )

    def attrs(self) -> dict[str, object]:
        return {"gpu_share": asdict(self)}

    def cap_gib(self) -> float:
        """The reservation in GiB, rounded down (gpu.memory_limit_gib)."""
        return math.floor(self.reserved_bytes / GIB * 1e4) / 1e4


def reservation(peaks: list[int], gpu: SharedGpu) -> int:
    """The bytes a trial reserves: the largest measured peak plus the preset's headroom of it;
    nothing measured yet: the whole GPU (it runs alone, and is measured)."""
    if not peaks:
        return gpu.memory_bytes
    return min(gpu.memory_bytes, math.ceil(max(peaks) / (1.0 - gpu.headroom)))


def measured_peaks(study: optuna.Study) -> list[int]:
    """The peak memory every trial of the study recorded (running ones have not yet)."""
    peaks = (t.user_attrs.get(PEAK) for t in study.get_trials(deepcopy=False))
    return [int(p) for p in peaks if isinstance(p, int | float) and p > 0]


@dataclass
class Book:
    """A ledger's content: the seats taken and the workers waiting for one."""

    seats: list[Seat]
    waiting: list[Seat]


class Ledger:
    """The seats taken on one GPU, in a JSON file every worker seated there locks to change."""

    def __init__(self, folder: Path, devices: str, host: str | None = None) -> None:
        self.host = host or socket.gethostname()
        self.path = folder / f"{self.host}_{devices}.json"

    def take(self, seat: Seat, capacity: int) -> list[Seat] | None:
        """Take `seat` when it fits beside the live seats within `capacity` bytes: the seats
        then taken, this one last. None when it does not fit: it is listed as waiting."""
        with self._locked() as book:
            book.waiting[:] = [s for s in book.waiting if s.pid != seat.pid]
            if book.seats and sum(s.bytes for s in book.seats) + seat.bytes > capacity:
                book.waiting.append(seat)
                return None
            book.seats.append(seat)
            return list(book.seats)

    def name_trial(self, pid: int, trial: int) -> None:
        with self._locked() as book:
            book.seats[:] = [Seat(s.host, s.pid, s.bytes, trial) if s.pid == pid else s
                             for s in book.seats]  # fmt: skip

    def leave(self, pid: int) -> None:
        """Give back the seat of worker `pid`, or stop waiting for one."""
        with self._locked() as book:
            book.seats[:] = [s for s in book.seats if s.pid != pid]
            book.waiting[:] = [s for s in book.waiting if s.pid != pid]

    def read(self) -> Book:
        with self._locked() as book:
            return book

    @contextlib.contextmanager
    def _locked(self) -> Iterator[Book]:
        """The live seats, under the lock; what the body leaves in them is written back."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with budget_lock(str(self.path.with_suffix(".lock"))):
            read = self._read()
            book = Book([s for s in read.seats if self._alive(s)],
                        [s for s in read.waiting if self._alive(s)])  # fmt: skip
            yield book
            if book != read:  # a worker waiting for room looks often, and mostly changes nothing
                self._write(book)

    def _read(self) -> Book:
        try:
            rows = json.loads(self.path.read_text())
            return Book(*([Seat(**row) for row in rows[k]] for k in ("seats", "waiting")))
        except (OSError, ValueError, KeyError, TypeError):  # none yet, or a torn file
            return Book([], [])

    def _write(self, book: Book) -> None:
        atomic_write_text(self.path, json.dumps(asdict(book), indent=1))

    def _alive(self, seat: Seat) -> bool:
        """A seat of this host's process that has ended is free (a worker killed mid-trial)."""
        if seat.host != self.host:
            return True
        try:
            os.kill(seat.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # alive, another user's
            return True
        return True


class GpuSharing:
    """A worker's side of the ledger: wait for room, hold a seat for one batch of trials."""

    def __init__(self, gpu: SharedGpu, ledger: Ledger, study: optuna.Study, poll: float) -> None:
        self.gpu = gpu
        self.ledger = ledger
        self.study = study
        self.poll = poll
        self.pid = os.getpid()

    @contextlib.contextmanager
    def seat(self, stopped: StopFlag) -> Iterator[GpuShare | None]:
        """A seat once the GPU has room (re-decided from the peaks measured meanwhile); None
        when the worker was asked to stop while it waited."""
        share = self._wait(stopped)
        try:
            yield share
        finally:
            if share is not None:
                self.ledger.leave(self.pid)

    def started(self, trial: int) -> None:
        self.ledger.name_trial(self.pid, trial)

    def _wait(self, stopped: StopFlag) -> GpuShare | None:
        waiting = False
        while not stopped.requested:
            peaks = measured_peaks(self.study)
            need = reservation(peaks, self.gpu)
            seats = self.ledger.take(Seat(self.ledger.host, self.pid, need), self.gpu.memory_bytes)
            if seats is not None:
                g = self.gpu
                peak = max(peaks) if peaks else None
                return GpuShare(g.devices, len(seats), need, g.memory_bytes, g.headroom, peak)
            if not waiting:
                log.info(
                    "Waiting for room on devices %s: this trial reserves %.2f of %.2f GiB",
                    self.gpu.devices,
                    need / GIB,
                    self.gpu.memory_bytes / GIB,
                )
                waiting = True
            time.sleep(self.poll)
        self.ledger.leave(self.pid)
        return None


class StopFlag(Protocol):
    """What `GpuSharing.seat` looks at while it waits (app.core.preemption.StopRequest is one)."""

    @property
    def requested(self) -> bool: ...


def gpu_sharing(
    ask: FleetAsk | None, gpu_node: object, sweep_dir: str, study: optuna.Study, poll: float
) -> GpuSharing | None:
    """This fleet worker's share of its GPU under hpo.trials_per_gpu=auto; None otherwise (a
    lone worker, a fixed number of trials per GPU, or no GPU)."""
    devices = os.environ.get(DEVICES_ENV)
    if ask is None or ask.trials_per_gpu is not None or not fleet_worker() or not devices:
        return None
    gpu = gpu_of(devices, gpu_node, ask.gpu_memory_gib)
    return GpuSharing(gpu, Ledger(Path(sweep_dir, "gpus"), devices), study, poll)


def gpu_of(devices: str, gpu_node: object, memory_gib: float | None) -> SharedGpu:
    """The GPU `devices` names, as its trials share it (a bad setting: SweepConfigError)."""
    node = OmegaConf.to_container(gpu_node, resolve=True) if OmegaConf.is_config(gpu_node) else {}
    settings = {str(k): v for k, v in node.items()} if isinstance(node, dict) else {}
    try:
        return shared_gpu(devices, settings, memory_gib)
    except ConfigError as e:
        raise SweepConfigError(str(e)) from None


def check_shared_gpus(plan: FleetPlan, ask: FleetAsk, gpu_node: object) -> None:
    """Before a fleet of this node starts: the memory of each GPU its workers share is known
    (NVML, or hpo.gpu_memory_gib); else one line naming the setting."""
    if ask.trials_per_gpu is None:
        for devices in sorted({",".join(d) for d in plan.devices if d}):
            gpu_of(devices, gpu_node, ask.gpu_memory_gib)
