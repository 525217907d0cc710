"""The on-disk micro-batch cache: one JSON file per shape, shared safely by parallel workers.

The key holds everything that changes the memory a micro-batch needs (device and its memory,
model config, sequence length, precision, gradient checkpointing, compile, optimizer, library
versions, injected faults, parallelism and world size), not the effective batch. Each entry
keeps every candidate's result
(OOM or not, peak memory fraction, samples/s), so a run with another memory margin or effective
batch reuses it. Writers take a file lock, merge and replace the file atomically; an OOM, once
seen, sticks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import torch

from app.components.hardware.memory import host_memory_bytes
from app.components.models.compiling import compiles
from app.components.models.config import ModelConfig
from app.components.optim import OPTIMIZERS
from app.components.tasks.base import Task
from app.config.budget import TrainBudget
from app.config.training import FaultsConfig, TrainingConfig
from app.core.atomic import atomic_write_text
from app.engine.run import Machine

log = logging.getLogger(__name__)
CACHE_VERSION = 1


class Trial(TypedDict, total=False):
    """One candidate micro-batch's outcome, as measured and as the cache file keeps it."""

    oom: bool
    error: str  # the OOM's first line
    peak_fraction: float | None  # of the memory limit's base (device or host memory)
    samples_per_sec: float | None  # the fastest timed step's
    learned_in_run: bool  # an OOM the run met after the probe


Trials = dict[int, Trial]  # by micro-batch
Key = Mapping[str, object]  # what changes a micro-batch's memory: see cache_key


class Entry(TypedDict):
    """A cache file: its key, the trials, how far a search went, when it last changed."""

    key: Key
    trials: Trials
    searched_up_to: int
    updated: float


def failed(trial: Trial, limit: float) -> bool:
    peak = trial.get("peak_fraction")
    return bool(trial.get("oom")) or (peak is not None and peak > limit)


def fits_below_failure(trials: Trials, limit: float, upper: int) -> tuple[list[int], int | None]:
    """Sizes that fit and lie below the smallest failure (memory use grows with the batch)."""
    first_fail = min((m for m, t in trials.items() if failed(t, limit)), default=None)
    fits = sorted(
        m
        for m, t in trials.items()
        if m <= upper and not failed(t, limit) and (first_fail is None or m < first_fail)
    )
    return fits, first_fail


@dataclass
class ProbeSetup:
    """What choosing the micro-batch needs, from the config and the machine: built by the
    runner, read by the probe and the cache key."""

    training: TrainingConfig
    model: ModelConfig
    faults: FaultsConfig
    machine: Machine
    task: Task
    seq_len: int  # the task's sequence length for this data
    budget: TrainBudget  # the run's: the probe's runs follow its LR schedule
    cache_dir: Path | None  # where the cache lives; None: no cache


def cache_key(setup: ProbeSetup, model: torch.nn.Module) -> dict[str, object]:
    """Everything that changes the memory a micro-batch needs (not the effective batch)."""
    import transformers

    device, m, t = setup.machine.device, setup.model, setup.training
    dist = setup.machine.dist
    return {
        "version": CACHE_VERSION,
        "device": [device.type, device.name, device.total_memory_bytes or host_memory_bytes()]
        + ([device.memory_limit_bytes] if device.memory_limit_bytes else []),  # fractions of it
        "task": setup.task.name,
        "model": dataclasses.asdict(m),
        "num_params": sum(p.numel() for p in model.parameters()),
        "vocab_size": getattr(getattr(model, "config", None), "vocab_size", None),
        "seq_len": setup.seq_len,
        "precision": setup.machine.precision.name,
        # With eval_micro_batch_size=auto the probe also evaluates at a multiple of each size.
        "eval_auto": t.eval_micro_batch.scaled,
        "gradient_checkpointing": bool(m.gradient_checkpointing),
        "compile": [compiles(m, setup.machine.preset), m.compile_mode],
        "optimizer": OPTIMIZERS.get(t.optimizer).cache_identity(t),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "faults": dataclasses.asdict(setup.faults),
        # Under FSDP a rank holds 1/world of the model state; DDP adds its gradient buckets.
        "parallelism": [dist.parallelism, dist.world_size]
        + ([t.fsdp.reshard_after_forward] if dist.sharded else []),
    }


def key_hash(key: Key) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]


def cache_path(folder: Path, key: Key) -> Path:
    return folder / f"microbatch-{key_hash(key)}.json"


def read_entry(path: Path, key: Key) -> Entry | None:
    """The cached entry with integer trial keys, or None (absent, unreadable or another key)."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict) or raw.get("key") != json.loads(json.dumps(key, default=str)):
        return None
    try:
        trials: Trials = {int(m): Trial(**t) for m, t in raw.get("trials", {}).items()}
    except (TypeError, ValueError):
        return None
    return Entry(
        key=raw["key"],
        trials=trials,
        searched_up_to=raw.get("searched_up_to", 0),
        updated=raw.get("updated", 0.0),
    )


def covers(entry: Entry, upper: int, limit: float) -> bool:
    """Whether the entry answers this run: a fit is known and the search reached its cap or
    found where memory runs out."""
    fits, first_fail = fits_below_failure(entry["trials"], limit, upper)
    reached = entry["searched_up_to"] >= upper
    return bool(fits) and (reached or (first_fail is not None and first_fail <= upper))


def merge_entry(path: Path, key: Key, trials: Trials, upper: int) -> None:
    def merge(entry: Entry) -> None:
        for micro, new in trials.items():
            entry["trials"][micro] = merge_trial(entry["trials"].get(micro, {}), new)
        entry["searched_up_to"] = max(entry["searched_up_to"], upper)

    update_entry(path, key, merge)


def record_oom(path: Path, key: Key, micro: int) -> None:
    def mark(entry: Entry) -> None:
        old = entry["trials"].get(micro, {})
        entry["trials"][micro] = merge_trial(old, {"oom": True, "learned_in_run": True})

    update_entry(path, key, mark)


def merge_trial(old: Trial, new: Trial) -> Trial:
    # An OOM seen by anyone sticks; the larger peak is the safer one; the newest timing wins.
    out: Trial = {**old, **new}
    out["oom"] = bool(old.get("oom") or new.get("oom"))
    peaks = [p for p in (old.get("peak_fraction"), new.get("peak_fraction")) if p is not None]
    out["peak_fraction"] = max(peaks) if peaks else None
    return out


def update_entry(path: Path, key: Key, change: Callable[[Entry], None]) -> None:
    """Read, change and atomically rewrite the entry under an exclusive lock."""
    try:
        with _locked(path):
            entry = read_entry(path, key) or Entry(key=key, trials={}, searched_up_to=0, updated=0)
            change(entry)
            entry["updated"] = time.time()
            # JSON's keys are strings: the trials are written by micro-batch in order.
            trials = {str(m): t for m, t in sorted(entry["trials"].items())}
            text = json.dumps({**entry, "trials": trials}, indent=2, sort_keys=True, default=str)
            atomic_write_text(path, text + "\n")
    except OSError as exc:  # a read-only or full cache dir must not fail the run
        log.warning("could not update the micro-batch cache %s: %s", path, exc)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        try:
            import fcntl
        except ImportError:  # no flock (Windows): atomic replace still prevents torn files
            yield
            return
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
