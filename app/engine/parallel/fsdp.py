"""training.parallelism=fsdp: the model sharded over the ranks with FSDP2
(`torch.distributed.fsdp.fully_shard`), one unit per transformer block and one at the root.

Each rank holds 1/world of every parameter, its gradient and its optimizer state (DTensors);
a block's full weights are all-gathered just before its forward (and again before its backward
when `training.fsdp.reshard_after_forward`), and its gradients reduce-scattered on the step's
last micro-batch. The mixed-precision policy follows the run's precision plan: with bf16 the
weights are gathered and computed in bf16 and the gradients reduced in fp32. With
`model.compile`, each block is compiled before it is sharded (what FSDP2 composes with; a
whole-model compile would trace through FSDP's hooks); activation checkpointing is the model's
own (transformers' gradient checkpointing), applied when it is built.

In a single process FSDP2 runs over a process group of one: nothing is sharded (each shard is
the whole tensor), but the code path and the checkpoint format are those of many ranks, so its
checkpoints resume on any number of ranks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from app.components.hardware.precision import PrecisionPlan
from app.components.models.compiling import compiles
from app.components.models.config import ModelConfig
from app.config.training import FsdpConfig
from app.core.errors import ConfigError
from app.engine.run import Machine

if TYPE_CHECKING:
    from torch.distributed.checkpoint.state_dict import ValueType
    from torch.distributed.fsdp import MixedPrecisionPolicy


def check_precision(precision: PrecisionPlan) -> None:
    """What FSDP cannot train with on this device, as one line before any work."""
    if precision.use_grad_scaler:
        raise ConfigError(
            f"training.parallelism=fsdp with precision={precision.name}: fp16 needs a gradient "
            "scaler whose overflow check every rank shares, which this trainer does not run "
            "under FSDP; allowed: precision=bf16 (compute capability >= 8.0), tf32 or fp32, or "
            "training.parallelism=ddp"
        )


def mixed_precision(precision: PrecisionPlan) -> MixedPrecisionPolicy:
    """bf16: weights gathered and used in bf16, gradients reduced in fp32 (a sum of many
    ranks' bf16 gradients would lose their low bits); fp32 and TF32: nothing cast."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision.autocast_dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=precision.autocast_dtype, reduce_dtype=torch.float32)


def transformer_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated layers: the entries of each ModuleList with one entry per hidden layer
    (GPT-2's transformer.h, Llama's model.layers, the encoders' encoder.layer)."""
    layers = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    found: list[torch.nn.Module] = []
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == layers:
            found.extend(module)
    return found


def shard_model(
    model: torch.nn.Module, m: ModelConfig, fsdp: FsdpConfig, machine: Machine
) -> torch.nn.Module:
    """`model` (on the host, whole) sharded in place; its shards are moved to the device."""
    from torch.distributed.fsdp import fully_shard

    policy = mixed_precision(machine.precision)
    compiled = compiles(m, machine.preset)
    for block in transformer_blocks(model):
        if compiled:
            block.compile(mode=m.compile_mode)
        fully_shard(block, mp_policy=policy, reshard_after_forward=fsdp.reshard_after_forward)
    # The root holds the embeddings, the last norm and the head (tied to the embeddings in
    # GPT-2 and Llama); FSDP keeps the root's weights gathered from forward to backward.
    fully_shard(model, mp_policy=policy, reshard_after_forward=fsdp.reshard_after_forward)
    return model


def full_state_dict(model: torch.nn.Module) -> dict[str, ValueType]:
    """The whole model's weights on rank 0's host (empty elsewhere): every rank must call it,
    each sends its shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full = get_model_state_dict(model, options=options)
    # Tied weights (GPT-2's head and embeddings) come back as two tensors: one again, as in
    # the unsharded model, so save_pretrained writes it once.
    first: dict[int, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        kept = first.setdefault(id(param), name)
        if kept != name and kept in full and name in full:
            full[name] = full[kept]
    return full


def load_whole_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, weights: dict, optim: dict
) -> None:
    """A single-file checkpoint (a DDP or one-process run's) into a sharded model: every rank
    holds the whole state and keeps its shards. The optimizer state is keyed by parameter
    position there; FSDP's loader wants names, in the same order (the groups are built alike)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, weights, options=options)
    names = {id(p): n for n, p in model.named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    state = {order[int(i)]: v for i, v in optim.get("state", {}).items()}
    groups = [{**g, "params": [order[int(i)] for i in g["params"]]} for g in optim["param_groups"]]
    set_optimizer_state_dict(
        model, optimizer, {"state": state, "param_groups": groups}, options=options
    )
