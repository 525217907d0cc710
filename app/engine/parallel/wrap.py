"""How the ranks share the model (training.parallelism): where it lives, what runs forward,
and whether the ranks agree on out-of-memory errors."""

from __future__ import annotations

import torch

from app.components.models.compiling import maybe_compile
from app.components.models.config import ModelConfig
from app.config.schema import TrainConfig
from app.engine.comms.agreement import Agreement
from app.engine.comms.distributed import DistInfo, wrap_ddp
from app.engine.run import Machine


def place(model: torch.nn.Module, config: TrainConfig, machine: Machine) -> torch.nn.Module:
    """The model on its device: whole (one process, DDP), or sharded over the ranks (FSDP:
    built whole on the host, each rank keeping its shards on the device)."""
    if machine.dist.sharded:
        from app.engine.parallel.fsdp import shard_model

        return shard_model(model, config.model, config.training.fsdp, machine)
    return model.to(machine.torch_device)


def compiled_forward(model: torch.nn.Module, m: ModelConfig, machine: Machine) -> torch.nn.Module:
    """What trains forward, before DDP: the model compiled once for the probe and the run, or
    the model itself (FSDP: its blocks compiled in place; compile off: plain)."""
    if machine.dist.sharded:
        return model
    return maybe_compile(model, m, machine.preset)


def forward_model(compiled: torch.nn.Module, machine: Machine) -> torch.nn.Module:
    """What runs forward: `compiled_forward`'s module, in DDP under torchrun."""
    if machine.dist.sharded:
        return compiled
    return wrap_ddp(compiled, machine.dist, machine.torch_device)


def agreement(config: TrainConfig, dist: DistInfo) -> Agreement:
    """Under torchrun with OOM recovery on, the ranks agree at every phase boundary."""
    on = dist.enabled and config.training.auto_batch.oom_recovery
    return Agreement(dist.rank, enabled=on, group=dist.host_group)
