"""torchrun integration: read its environment, join the process group, wrap the model in DDP
(FSDP2: app/engine/parallel/fsdp.py).

Nothing here invents a distributed layer: torch.distributed does the work, this only wires it.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import gc
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Concatenate, ParamSpec, Protocol, TypeVar

import torch
import torch.distributed as dist


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    parallelism: str = "ddp"  # training.parallelism: ddp | fsdp
    # Where the ranks agree on host-side flags (out of memory): a gloo group beside NCCL, so
    # agreeing never waits for the GPU; None: the default group (gloo already).
    host_group: dist.ProcessGroup | None = None
    owns_group: bool = False  # this run joined the process group, so it leaves it
    # training.peer_timeout_s: how long a collective waits for the peers (app/engine/comms/peers.py)
    timeout_s: float | None = None
    backend: str = "gloo"
    peers_lost: bool = False  # a collective found the peers gone: the group is not destroyed

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def sharded(self) -> bool:
        """FSDP: every rank holds a shard of the model, so every rank saves and exports."""
        return self.parallelism == "fsdp"


def init_distributed(
    device_type: str, parallelism: str = "ddp", timeout_s: float | None = None
) -> DistInfo:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1); else a single process
    (with FSDP, a process group of one: fully_shard and its checkpoints need one). `timeout_s`
    (training.peer_timeout_s, resolved): how long a collective waits for the peers."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    backend = "nccl" if device_type == "cuda" else "gloo"
    if world <= 1:
        owns = parallelism == "fsdp" and not dist.is_initialized()
        if owns:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        return DistInfo(parallelism=parallelism, owns_group=owns)
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    info = DistInfo(rank, world, local, parallelism, owns_group=True, timeout_s=timeout_s)
    info.backend = backend
    host, device = group_timeouts(timeout_s, backend)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=device)
    if backend != "gloo":
        info.host_group = dist.new_group(backend="gloo", timeout=host)
    return info


# NCCL's watchdog waits this much longer than the host group: where the host waits in a
# collective of its own (every phase boundary under OOM recovery), the host group's timeout
# ends the run first, as a Python error with the one line; the watchdog (torchrun's agent sets
# TORCH_NCCL_ASYNC_ERROR_HANDLING=1: it tears the process down) is the bound where only the
# device waits, the host blocked in a sync. Untested on GPUs here.
NCCL_MARGIN_S = 10.0


def group_timeouts(
    timeout_s: float | None, backend: str
) -> tuple[datetime.timedelta | None, datetime.timedelta | None]:
    """(the host group's, the default group's) timeouts; None: torch's defaults."""
    if timeout_s is None:
        return None, None
    host = datetime.timedelta(seconds=timeout_s)
    margin = NCCL_MARGIN_S if backend == "nccl" else 0.0
    return host, datetime.timedelta(seconds=timeout_s + margin)


def wrap_ddp(model: torch.nn.Module, info: DistInfo, device: torch.device) -> torch.nn.Module:
    if not info.enabled:
        return model
    ids = [device.index] if device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)


def no_sync(model: torch.nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """Skip the gradient reduction (DDP's all-reduce, FSDP's reduce-scatter) on every
    micro-batch but the step's last."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(sync)  # read in its backward: set before each one
        return contextlib.nullcontext()
    if sync or not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return contextlib.nullcontext()
    return model.no_sync()


class OnRanks(Protocol):
    """What runs on the ranks: a run, a probe's run."""

    @property
    def dist(self) -> DistInfo: ...


R = TypeVar("R", bound=OnRanks)
P = ParamSpec("P")
T = TypeVar("T")


def without_autograd(fn: Callable[Concatenate[R, P], T]) -> Callable[Concatenate[R, P], T]:
    """Run `fn(run, ...)` under torch.inference_mode(), or torch.no_grad() when the model is
    sharded: FSDP allocates the buffers it gathers weights into on first use, and made in
    inference mode they could not serve the training forwards after it (torch 2.13)."""

    @functools.wraps(fn)
    def wrapper(run: R, /, *args: P.args, **kwargs: P.kwargs) -> T:
        mode = torch.no_grad() if run.dist.sharded else torch.inference_mode()
        with mode:
            return fn(run, *args, **kwargs)

    return wrapper


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


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier(group=info.host_group)


_HOST_BUFFERS: dict[tuple[str, int, torch.dtype], torch.Tensor] = {}


def host_buffer(
    name: str, values: Sequence[float], dtype: torch.dtype = torch.int64
) -> torch.Tensor:
    """A host tensor holding `values` for a small collective, the same tensor each time and
    kept for the life of the process. gloo's worker thread frees a collective's tensors late,
    up to when the group is destroyed; freeing one whose Python object is gone needs the
    GIL, which the destroying thread holds when DDP's reducer drops the group: a hang at exit
    (about 1 run in 10 on torch 2.13). A tensor Python still holds is freed without it."""
    key = (name, len(values), dtype)
    if key not in _HOST_BUFFERS:
        with torch.inference_mode(False):  # a normal tensor, updated in and out of that mode
            _HOST_BUFFERS[key] = torch.zeros(len(values), dtype=dtype)
    buffer = _HOST_BUFFERS[key]
    buffer.copy_(torch.tensor(values, dtype=dtype))
    return buffer


def agree_all(flag: bool, info: DistInfo) -> bool:
    """True on every rank when `flag` is True on every rank (a host all-reduce)."""
    if not info.enabled:
        return flag
    t = host_buffer("agree_all", [int(not flag)])
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=info.host_group)
    return not bool(t.item())


def rank0_word(values: Sequence[int], info: DistInfo) -> list[int]:
    """Rank 0's `values` on every rank (a host broadcast): a decision only rank 0 can take,
    which every rank must act on at the same step."""
    if not info.enabled:
        return list(values)
    t = host_buffer("rank0_word", values)
    dist.broadcast(t, src=0, group=info.host_group)
    return [int(v) for v in t.tolist()]


def shutdown(info: DistInfo) -> None:
    # NCCL's group is left to the process exit when the peers are lost: destroying it would
    # wait for the collective they never joined (gloo's fails at once and is destroyed).
    stuck = info.peers_lost and info.backend != "gloo"
    if (info.enabled or info.owns_group) and dist.is_initialized() and not stuck:
        dist.destroy_process_group()
        release_mesh_groups()


def release_mesh_groups() -> None:
    """The destroyed process groups, let go by every device mesh that still holds them. DTensor's
    caches (sharding propagation, redistribution plans) keep FSDP's mesh, and the copies of it
    that checkpointing makes, alive for the life of the process, and each mesh keeps its groups
    in a registry; so destroy_process_group alone leaves gloo's worker threads running into the
    interpreter's finalization, where a worker that frees a finished collective's tensor needs
    the GIL that finalization no longer hands out, and the process aborts ("terminate called
    without an active exception", SIGABRT: a resumed two-rank FSDP run now and then). Emptying
    the registries frees the groups now, their threads joined while Python still serves them.
    `_pg_registry` is DeviceMesh's own (torch has no public way to drop it): the exit test in
    tests/test_fsdp.py checks that no gloo thread outlives a run, on the installed torch."""
    if "torch.distributed.device_mesh" not in sys.modules:
        return  # no mesh was ever made (DDP, one process)
    from torch.distributed.device_mesh import DeviceMesh

    for obj in gc.get_objects():
        registry = getattr(obj, "_pg_registry", None) if isinstance(obj, DeviceMesh) else None
        if isinstance(registry, dict):
            registry.clear()
