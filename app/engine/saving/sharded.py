"""Sharded checkpoints (training.parallelism=fsdp): a directory per step (`checkpoints/
step_00000300/` for step 300), written by every rank with torch.distributed.checkpoint (DCP)
and loadable on any number of ranks.

The directory holds DCP's files (each rank's shards, `__<rank>_0.distcp`, and `.metadata`, the
index) with the model and the optimizer state, tensors only, from
torch.distributed.checkpoint.state_dict; and `train_state.pt`, the rest of the TrainState
(step, RNG, schedule, plan, the optimizer's hyperparameters), written by rank 0 with
torch.save and read with weights_only=True as single-file checkpoints are.

Complete or absent: every rank writes into `.step_<step>.tmp/`; when DCP has written the
index (after all ranks' shards) rank 0 adds train_state.pt, fsyncs and renames the directory
into place. A crash before the rename leaves the previous checkpoint the latest; the next save
removes the temporary.

Safe to load: DCP reads `.metadata` with pickle and non-tensor entries with
torch.load(weights_only=False), either of which runs code from the file. Here the index is
read by an unpickler that only builds DCP's own metadata records, and a checkpoint holding
anything but tensors is refused, so nothing is unpickled beyond that.
"""

from __future__ import annotations

import enum
import os
import pickle
import shutil
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed.checkpoint as dcp

if TYPE_CHECKING:
    from torch.distributed.checkpoint.metadata import Metadata
    from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
    from torch.distributed.checkpoint.state_dict import ListDictValueType
    from torch.distributed.checkpoint.storage import WriteResult
    from torch.futures import Future

STATE_FILE = "train_state.pt"
INDEX_FILE = ".metadata"

# What DCP's index may name: its records, dtypes, sizes, layouts and paths, nothing that runs.
_INDEX_CLASSES = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "TensorProperties",
        "ChunkStorageMetadata",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath", "Path"},
    "collections": {"OrderedDict"},
}


class _IndexUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> object:
        if name in _INDEX_CLASSES.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) == ("builtins", "getattr"):
            # Some builds of torch (the CUDA wheels on PyPI) pickle an enum member by name,
            # `getattr(_MEM_FORMAT_ENCODING, "TORCH_CONTIGUOUS")`: only that, the member of an
            # enum the index may name, is looked up.
            return _enum_member
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint index")


def _enum_member(owner: object, name: object) -> enum.Enum:
    if isinstance(owner, type) and issubclass(owner, enum.Enum) and name in owner.__members__:
        return owner[str(name)]
    raise pickle.UnpicklingError(f"getattr({owner!r}, {name!r}) is not part of a checkpoint index")


class SafeReader(dcp.FileSystemReader):
    """DCP's file reader, its index read by the restricted unpickler and checked to hold
    tensors only."""

    def read_metadata(self, *args: object, **kwargs: object) -> Metadata:
        from torch.distributed.checkpoint.metadata import StorageMeta, TensorStorageMetadata

        with open(Path(self.path) / INDEX_FILE, "rb") as f:
            metadata = _IndexUnpickler(f).load()
        entries = getattr(metadata, "state_dict_metadata", None)
        if not isinstance(entries, dict):
            raise ValueError("the index lists no tensors")
        for key, entry in entries.items():
            if not isinstance(entry, TensorStorageMetadata):
                raise ValueError(f"{key} is not a tensor")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class _Writer(dcp.FileSystemWriter):
    """DCP's file writer; `kill` (faults.kill_in_checkpoint) SIGKILLs this process once its
    shards are on disk, before the checkpoint is complete."""

    def __init__(self, path: Path, kill: bool) -> None:
        super().__init__(path)
        self.kill = kill

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        done = super().write_data(plan, planner)
        if self.kill:
            done.wait()
            os.kill(os.getpid(), signal.SIGKILL)
        return done


def is_sharded(path: Path) -> bool:
    return path.is_dir() and (path / STATE_FILE).is_file()


def temporary(final: Path) -> Path:
    return final.with_name(f".{final.name}.tmp")


def write_shards(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, tmp: Path, kill: bool
) -> ListDictValueType:
    """This rank's shards of the model and optimizer into `tmp` (a collective); returns the
    optimizer's hyperparameters (param_groups), which go to train_state.pt."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    weights = get_model_state_dict(model)
    optim = get_optimizer_state_dict(model, optimizer)
    dcp.save({"model": weights, "optimizer": optim["state"]}, storage_writer=_Writer(tmp, kill))
    groups = optim["param_groups"]
    if not isinstance(groups, list):  # torch's type is one for both keys of the dict
        raise TypeError("the optimizer's state holds no list of param_groups")
    return list(groups)


def finish(tmp: Path, final: Path, small: Mapping[str, object]) -> None:
    """Rank 0: the small state beside the shards, then the directory renamed into place."""
    from app.core.atomic import atomic_write, fsync_dir

    atomic_write(tmp / STATE_FILE, lambda f: torch.save(small, f))
    fsync_dir(tmp)
    old = final.with_name(f".{final.name}.old")
    if final.exists():  # a checkpoint of this step from an earlier attempt of the run
        # Aside first, then replaced: a kill while the old copy is deleted leaves no half of it
        # under the checkpoint's name (the next save removes the leftover).
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def read_small_state(path: Path) -> dict[str, object]:
    """train_state.pt, as a single-file checkpoint is read; the index checked too."""
    state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    SafeReader(path).read_metadata()
    if not isinstance(state, dict):
        raise ValueError(f"{STATE_FILE} holds no mapping")
    return state


def load_shards(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    path: Path,
    groups: ListDictValueType,
) -> None:
    """The checkpoint's weights and optimizer state into this run's model, whatever its
    world size or parallelism (DCP reshards): FSDP shards, or a whole model per rank."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    weights = get_model_state_dict(model)
    optim = get_optimizer_state_dict(model, optimizer)  # its state allocated, to fill
    read({"model": weights, "optimizer": optim["state"]}, path)
    set_model_state_dict(model, weights)
    set_optimizer_state_dict(model, optimizer, {"state": optim["state"], "param_groups": groups})


def load_weights(model: torch.nn.Module, path: Path) -> None:
    """The checkpoint's weights alone into a whole model, in one process (the export)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    weights = get_model_state_dict(model)
    read({"model": weights}, path)
    set_model_state_dict(model, weights)


def read(state: dict[str, object], path: Path) -> None:
    """DCP's load of `state`'s tensors from `path`, through the safe reader."""
    import warnings

    with warnings.catch_warnings():  # one process: DCP notes it loads without a group
        warnings.filterwarnings("ignore", message=".*single process.*", category=UserWarning)
        dcp.load(state, storage_reader=SafeReader(path))


def remove_temporaries(directory: Path) -> None:
    """Temporary directories of sharded writes that a kill interrupted (and replaced copies
    of a step a kill left aside)."""
    if directory.is_dir():
        for tmp in [*directory.glob(".step_*.tmp"), *directory.glob(".step_*.old")]:
            shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink()
