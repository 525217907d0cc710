"""The fleet a sweep runs: how many workers, which devices each one gets, decided and checked
before anything starts (docs/scaling.md, "A node, a cluster").

A worker is the ordinary one-process sweep worker (`_worker.Worker`: n_jobs=1, the study-wide
budget, the shared storage). A fleet is N of them: started as processes of this node
(`_fleet.LocalFleet`) or as jobs of a Hydra launcher (`_fleet_jobs`). Each worker is pinned to
its own devices through CUDA_VISIBLE_DEVICES, set before the process (or job) starts CUDA; the
list is faked on a machine without a GPU exactly as on one with GPUs, so it can be tested.

A process learns that it is a fleet's worker, and which, from WORKER_ENV: it then runs as a
plain worker whatever `hpo.workers` says.

With hpo.trials_per_gpu=auto a GPU seats up to hpo.max_trials_per_gpu workers, and how many
of them run a trial at once is decided as trials finish, from their measured peak memory
(`_gpu_share`).
"""

from __future__ import annotations

import copy
import math
import os
import socket
from dataclasses import dataclass

from omegaconf import DictConfig

from .._errors import SweepConfigError

WORKER_ENV = "HYDRATRAIN_FLEET_WORKER"  # this process is worker <n> of a fleet
DEVICES_ENV = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class FleetPlan:
    workers: int
    devices: tuple[tuple[str, ...], ...]  # per worker; () leaves CUDA_VISIBLE_DEVICES alone
    gpus_per_trial: int
    trials_per_gpu: int | None = 1  # None: auto, up to max_trials_per_gpu as memory allows
    max_trials_per_gpu: int = 1

    @property
    def is_fleet(self) -> bool:
        return self.workers > 1

    def env(self, index: int) -> dict[str, str]:
        """What worker `index` adds to its environment, before anything starts CUDA."""
        env = {WORKER_ENV: str(index)}
        if self.devices[index]:
            env[DEVICES_ENV] = ",".join(self.devices[index])
        return env

    def describe(self) -> str:
        per = ", ".join(
            f"{i}: {','.join(d) if d else 'as launched'}" for i, d in enumerate(self.devices)
        )
        ranks = f", {self.gpus_per_trial} ranks per trial" if self.gpus_per_trial > 1 else ""
        share = (
            f", trials per GPU: auto (from measured peak memory, at most {self.max_trials_per_gpu})"
            if self.trials_per_gpu is None
            else ""
        )
        return f"{self.workers} workers (devices {per}){ranks}{share}"


@dataclass(frozen=True)
class FleetAsk:
    """What hpo.workers, devices, gpus_per_trial and trials_per_gpu (with max_trials_per_gpu
    and gpu_memory_gib) ask for, each checked (`plan_fleet` fits them to the machine)."""

    workers: int | None = 1  # None: auto, one per seat of the devices (1 without a GPU)
    devices: tuple[str, ...] | None = None  # None: the visible GPUs
    gpus_per_trial: int = 1
    trials_per_gpu: int | None = 1  # None: auto, sized from measured peak memory
    max_trials_per_gpu: int = 4  # auto: the workers each GPU seats
    gpu_memory_gib: float | None = None  # auto: each GPU's memory; None: the card's

    @classmethod
    def of(
        cls,
        workers: object,
        devices: object,
        gpus_per_trial: object,
        trials_per_gpu: object,
        max_trials_per_gpu: object = 4,
        gpu_memory_gib: object = None,
    ) -> FleetAsk:
        """The settings as written (hpo.workers and hpo.trials_per_gpu are a number or auto,
        hpo.devices null or a list); a bad one raises SweepConfigError naming it."""
        k = _positive_int(gpus_per_trial, "hpo.gpus_per_trial")
        auto = trials_per_gpu == "auto"
        share = None if auto else _positive_int(trials_per_gpu, "hpo.trials_per_gpu", "auto")
        most = _positive_int(max_trials_per_gpu, "hpo.max_trials_per_gpu")
        pool = None if devices is None else _device_list(devices)
        n = None if workers == "auto" else _positive_int(workers, "hpo.workers", also="auto")
        return cls(n, pool, k, share, most, _gib(gpu_memory_gib))

    @property
    def seats_per_group(self) -> int:
        """The workers one group of devices serves."""
        return self.max_trials_per_gpu if self.trials_per_gpu is None else self.trials_per_gpu


def plan_fleet(ask: FleetAsk, visible: list[str]) -> FleetPlan:
    """The fleet `ask` asks for on the GPUs this machine shows (`visible`); one the devices
    cannot seat raises SweepConfigError."""
    k, share = ask.gpus_per_trial, ask.seats_per_group
    pool = list(visible if ask.devices is None else ask.devices)
    if pool and len(pool) % k:
        raise SweepConfigError(
            f"hpo.devices={pool} cannot be split into groups of hpo.gpus_per_trial={k}; "
            f"allowed: a multiple of {k} devices"
        )
    groups = [tuple(pool[i : i + k]) for i in range(0, len(pool), k)]
    seats = len(groups) * share  # a group serves `share` workers
    n = max(1, seats) if ask.workers is None else ask.workers
    if groups and n > seats:
        raise SweepConfigError(
            f"hpo.workers={n} is more than the devices {pool} seat: groups of "
            f"hpo.gpus_per_trial={k}, {_seats_key(ask)}={share} per group; "
            f"allowed: auto or 1..{seats}"
        )
    # Round the groups first: two workers share a GPU only once every GPU has one.
    assigned = tuple(groups[i % len(groups)] if groups else () for i in range(n))
    return FleetPlan(n, assigned, k, ask.trials_per_gpu, ask.max_trials_per_gpu)


def _seats_key(ask: FleetAsk) -> str:
    return "hpo.trials_per_gpu" if ask.trials_per_gpu is not None else "hpo.max_trials_per_gpu"


def _gib(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < math.inf:
        return float(value)
    raise SweepConfigError(
        f"hpo.gpu_memory_gib={value!r} is not allowed; allowed: null (the card's memory) or a "
        "positive number of GiB"
    )


def _positive_int(value: object, key: str, also: str = "") -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    allowed = f"{also} or a positive integer" if also else "a positive integer"
    raise SweepConfigError(f"{key}={value!r} is not allowed; allowed: {allowed}")


def _device_list(value: object) -> tuple[str, ...]:
    items = list(value) if isinstance(value, list | tuple) else None
    if (
        not items
        or not all(_device_name(d) for d in items)
        or len(set(map(str, items))) != len(items)
    ):
        raise SweepConfigError(
            f"hpo.devices={value!r} is not allowed; allowed: null (the visible GPUs) or a list "
            "of distinct device indices or UUIDs, e.g. [0,1]"
        )
    return tuple(str(d) for d in items)


def _device_name(d: object) -> bool:
    if isinstance(d, bool):
        return False
    if isinstance(d, int):
        return d >= 0
    return isinstance(d, str) and bool(d) and "," not in d and not d.isspace()


@dataclass(frozen=True)
class WorkerIdentity:
    """Who runs a trial, recorded on it: the fleet's worker number (None outside a fleet),
    the host, the process and CUDA_VISIBLE_DEVICES as the worker saw it."""

    worker: int | None
    host: str
    pid: int
    devices: str | None

    @classmethod
    def here(cls) -> WorkerIdentity:
        index = os.environ.get(WORKER_ENV)
        return cls(
            worker=int(index) if index is not None and index.isdigit() else None,
            host=socket.gethostname(),
            pid=os.getpid(),
            devices=os.environ.get(DEVICES_ENV),
        )

    def attrs(self) -> dict[str, str | int | None]:
        return {
            "worker": self.worker,
            "host": self.host,
            "worker_pid": self.pid,
            "devices": self.devices,
        }


def fleet_worker() -> bool:
    """This process is one worker of a fleet (never a fleet's parent)."""
    return os.environ.get(WORKER_ENV) is not None


def seeded_for_worker(sampler: DictConfig) -> DictConfig:
    """Worker n of a fleet samples with seed + n: with one seed, every worker would ask for
    the same points while no trial has finished yet (the random start-up trials)."""
    index = os.environ.get(WORKER_ENV, "")
    if not index.isdigit() or sampler.get("seed") is None:
        return sampler
    node = copy.deepcopy(sampler)
    node.seed = int(sampler.seed) + int(index)
    return node
