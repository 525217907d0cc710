"""One optimizer step: the micro-batches of this rank's share of the effective batch, the loss
normalized by the units of the whole step (so the gradient does not depend on the split), then
clipping, the optimizer and the schedule."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from app.components.hardware.precision import autocast
from app.components.tasks.base import move
from app.engine.distributed import global_sum, no_sync
from app.engine.run import Run


class StepResult(NamedTuple):
    loss_sum: torch.Tensor  # on the device: summed over the step's units
    units: int  # what the loss is averaged over (target tokens, samples)
    grad_norm: torch.Tensor
    tokens: int  # input tokens that carry data, for tokens/s


def loss_sum(run: Run, x: Any, y: torch.Tensor) -> torch.Tensor:
    """The task's summed loss of one micro-batch under the run's autocast."""
    with autocast(run.precision, run.device):
        return run.task.loss_sum(run.model, x, y)


def train_step(run: Run, batch: Any, step: int) -> StepResult:
    """One optimizer step over `batch` (this rank's share of the effective batch)."""
    x_all, y_all = run.task.inputs_and_targets(batch)
    units = run.task.units(y_all)  # on the host tensor: no device sync
    # DDP averages gradients over ranks, so scale by world / global units for an exact mean.
    divisor = global_sum(units, run.dist, run.device)
    scale = run.dist.world_size / divisor
    sizes = run.plan.micro_sizes
    total = torch.zeros((), device=run.device)
    for i, (x, y) in enumerate(run.task.micro_batches(x_all, y_all, sizes)):
        x, y = move(x, run.device), y.to(run.device, non_blocking=True)
        with no_sync(run.model, sync=i == len(sizes) - 1):
            run.faults.check("forward", len(y), step)
            part = loss_sum(run, x, y)
            run.faults.check("backward", len(y), step)
            scaled = part * scale
            (run.scaler.scale(scaled) if run.scaler else scaled).backward()
        total += part.detach()
    grad_norm = optimizer_step(run, step)
    return StepResult(total, units, grad_norm, run.task.tokens(x_all))


def optimizer_step(run: Run, step: int) -> torch.Tensor:
    run.faults.check("optimizer", run.plan.micro_batch_size, step)
    if run.scaler:
        run.scaler.unscale_(run.optimizer)
    max_norm = run.cfg.max_grad_norm if run.cfg.max_grad_norm > 0 else math.inf
    grad_norm = torch.nn.utils.clip_grad_norm_(run.raw_model.parameters(), max_norm)
    if run.scaler:
        run.scaler.step(run.optimizer)
        run.scaler.update()
    else:
        run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    run.scheduler.step()
    return grad_norm
