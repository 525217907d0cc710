"""torchrun integration: read its environment, join the process group, wrap the model in DDP.

Nothing here invents a distributed layer: torch.distributed does the work, this only wires it.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device_type: str) -> DistInfo:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1); else a single process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    info = DistInfo(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    return info


def wrap_ddp(model: torch.nn.Module, info: DistInfo, device: torch.device) -> torch.nn.Module:
    if not info.enabled:
        return model
    ids = [device.index] if device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)


def no_sync(model: torch.nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """Skip DDP's gradient all-reduce on every micro-batch but the step's last."""
    if sync or not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return contextlib.nullcontext()
    return model.no_sync()


def global_sum(value: float, info: DistInfo, device: torch.device) -> torch.Tensor | float:
    """Sum over ranks; a device tensor under DDP (no host sync), the plain value otherwise."""
    if not info.enabled:
        return value
    t = torch.tensor(float(value), device=device)
    dist.all_reduce(t)
    return t


def all_reduce_sum(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Sum `t` over ranks in place (a no-op in a single process); returns it."""
    if info.enabled:
        dist.all_reduce(t)
    return t


def any_rank(flag: bool, info: DistInfo, device: torch.device) -> bool:
    """True on every rank when `flag` is True on any (a host sync under DDP; free otherwise)."""
    if not info.enabled:
        return flag
    t = torch.tensor(float(flag), device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def unwrap_ddp(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside DDP (maybe compiled): a forward with no collectives in it."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return model.module
    return model


def shared_run_dir(run_dir: Path, info: DistInfo) -> Path:
    """Rank 0's run directory for every rank: Hydra stamps each rank's own with its start time,
    and `training.resume=auto` must find the same checkpoints everywhere."""
    if not info.enabled:
        return run_dir
    box = [str(run_dir)]
    dist.broadcast_object_list(box, src=0)
    return Path(box[0])


def shutdown(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()
