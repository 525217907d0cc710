"""Checkpoints that are complete or absent, and safe to load.

A checkpoint is one typed record (`TrainState`) stored as its mapping in one file, written to a
temporary name, fsynced, then renamed into place: a crash leaves either the previous
checkpoints or the new one, never half a file. Loading uses `torch.load(weights_only=True)`,
which refuses to unpickle arbitrary objects: plain tensors and containers only, so the format
stays what `python -m app.export` and earlier runs read. With FSDP a checkpoint is a directory
of shards instead, complete or absent the same way (app/engine/saving/sharded.py); both
kinds are listed, resumed and exported alike.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import random
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import torch
from torch.optim.optimizer import StateDict

from app.config.training import ResumeFrom
from app.core.atomic import atomic_write, fsync_dir
from app.core.errors import ConfigError
from app.core.outcomes import WriteFailed
from app.engine.saving import sharded as sharded

_NAME = re.compile(r"^step_(\d{8})(\.pt)?$")  # a file, or a directory of shards


# What a checkpoint must hold to be resumed (the rest have defaults for older files).
REQUIRED = ("model", "optimizer", "scheduler", "step", "rng")


class RngState(TypedDict, total=False):
    """The random generators' states a checkpoint restores."""

    python: Sequence[object]  # random.getstate(); the safe loader may hand back lists
    torch: torch.Tensor
    cuda: list[torch.Tensor]  # one per device, where CUDA is available


@dataclass
class TrainState:
    model: dict[str, torch.Tensor]
    optimizer: StateDict = field(default_factory=dict)  # as torch types it
    scheduler: dict[str, object] = field(default_factory=dict)
    step: int = 0  # optimizer steps done; the data position follows from it
    rng: RngState = field(default_factory=RngState)
    scaler: dict[str, object] = field(default_factory=dict)
    plan: dict[str, object] = field(default_factory=dict)  # the batch plan it was trained with
    # training.noise_scale's averages (NoiseScale.state_dict); empty without it, or written
    # before they were kept (the estimate then starts again)
    noise: dict[str, float | int] = field(default_factory=dict)
    # training.batch_schedule=adaptive: its phases and its rule's state (BatchGrowth.state_dict);
    # empty for a fixed batch
    batch_schedule: dict[str, object] = field(default_factory=dict)
    # what shaped the model: a resume is checked against it
    config: dict[str, object] | None = None
    tokenizer_sha256: str | None = None  # which tokenizer the export pairs it with
    # A sharded checkpoint: its directory, whose shards hold the model and the optimizer's
    # state (`model` is then empty and `optimizer` holds only its param_groups).
    shards: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, state: Mapping[str, object]) -> TrainState:
        """The record a checkpoint file holds; its values are taken as this trainer wrote them
        (the safe loader let only tensors and containers through)."""
        names = {f.name for f in dataclasses.fields(cls)}
        fields: dict[str, Any] = {k: v for k, v in state.items() if k in names}
        return cls(**fields)


def checkpoint_path(directory: Path, step: int) -> Path:
    return directory / f"step_{step:08d}.pt"


def checkpoint_dir(directory: Path, step: int) -> Path:
    return directory / f"step_{step:08d}"


def list_checkpoints(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    steps = {
        p: m.group(1)
        for p in directory.iterdir()
        if (m := _NAME.match(p.name)) and (m.group(2) or sharded.is_sharded(p))
    }
    return sorted(steps, key=lambda p: int(steps[p]))


def drop_old(directory: Path, keep: int) -> None:
    """All but the last `keep` checkpoints, files and directories of shards alike."""
    for old in list_checkpoints(directory)[:-keep]:
        shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink(missing_ok=True)


def save_checkpoint(directory: Path, step: int, state: TrainState, keep: int) -> Path:
    """Write step `step`'s checkpoint, then drop all but the last `keep`. Raises WriteFailed
    (one line; the earlier checkpoints intact, no temporary file left) when the write fails."""
    final = checkpoint_path(directory, step)
    remove_stale_temporaries(directory)
    try:
        atomic_write(final, lambda f: torch.save(state.as_dict(), f))
        fsync_dir(directory)  # make the rename itself durable before older checkpoints go
    except (OSError, RuntimeError) as exc:  # torch reports a full disk as a RuntimeError
        raise WriteFailed(
            f"could not write checkpoint {final} ({first_reason(exc, directory)}); the earlier "
            "checkpoints are intact"
        ) from None
    drop_old(directory, keep)
    return final


def first_reason(exc: BaseException, directory: Path) -> str:
    if isinstance(exc, OSError) and exc.errno is not None:
        return os.strerror(exc.errno)
    with contextlib.suppress(OSError):
        if shutil.disk_usage(directory).free < 1 << 20:
            return os.strerror(errno.ENOSPC)
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def remove_stale_temporaries(directory: Path) -> None:
    """Temporary files of checkpoint writes that a kill interrupted (see app/core/atomic.py), and
    temporary directories of sharded ones."""
    if directory.is_dir():
        for tmp in directory.glob(".step_*.pt.*.tmp"):
            tmp.unlink(missing_ok=True)
    sharded.remove_temporaries(directory)


def find_resume_checkpoint(resume: ResumeFrom | None, run_dir: Path) -> Path | None:
    """auto: this run's latest checkpoint if any; a path: a run dir, checkpoint dir or file."""
    if resume is None:
        return None
    if resume.path is None:
        found = list_checkpoints(run_dir / "checkpoints")
        return found[-1] if found else None
    path = Path(resume.path)
    if sharded.is_sharded(path):
        return path
    for candidate in (path / "checkpoints", path):
        if candidate.is_dir():
            found = list_checkpoints(candidate)
            if found:
                return found[-1]
    if path.is_file():
        return path
    raise ConfigError(
        f"training.resume={resume.path!r}: no checkpoint there; give a run directory, its "
        "checkpoints/ directory, a step_*.pt file, a step_* directory of shards, or auto"
    )


def load_checkpoint(path: Path, mmap: bool = False) -> TrainState:
    """The checkpoint's state; `mmap` maps the tensors instead of reading them (a quick look).
    Of a sharded checkpoint, all but the shards, which load into the model once it is built."""
    try:
        if sharded.is_sharded(path):
            state = {**sharded.read_small_state(path), "model": {}, "shards": str(path)}
        else:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:
        raise ConfigError(
            f"training.resume: checkpoint {path} is unreadable ({type(exc).__name__}); "
            "point training.resume at an earlier step_* checkpoint"
        ) from exc
    missing = set(REQUIRED) - set(state) if isinstance(state, dict) else set(REQUIRED)
    if missing:
        raise ConfigError(
            f"training.resume: checkpoint {path} lacks {', '.join(sorted(missing))}; "
            "it was not written by this trainer"
        )
    return TrainState.from_dict(state)


def rng_state() -> RngState:
    state: RngState = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: RngState) -> None:
    random.setstate(_as_tuple(state["python"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuple(value: Sequence[object]) -> tuple[object, ...]:
    # Python's RNG state is nested tuples; the safe loader may hand back lists.
    return tuple(_as_tuple(v) if isinstance(v, list | tuple) else v for v in value)
