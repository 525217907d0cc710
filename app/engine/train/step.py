"""One optimizer step: the micro-batches of this rank's share of the effective batch, the loss
normalized by the units of the whole step (so the gradient does not depend on the split), then
clipping, the optimizer and the schedule. Under torchrun the ranks agree on out-of-memory errors
at each phase boundary (app/engine/comms/agreement.py), so a step fails on every rank or on none."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from app.components.hardware.precision import autocast
from app.components.tasks.base import move
from app.engine.comms.distributed import global_sum, no_sync
from app.engine.parallel.rank_memory import measure_state_bytes
from app.engine.records.noise_scale import sq_grad_norm
from app.engine.run import Inputs, Run, Samples


class StepResult(NamedTuple):
    loss_sum: torch.Tensor  # on the device: summed over the step's units
    units: int  # what the loss is averaged over (target tokens, samples)
    grad_norm: torch.Tensor
    tokens: int  # input tokens that carry data, for tokens/s


def loss_sum(run: Run, x: Inputs, y: torch.Tensor) -> torch.Tensor:
    """The task's summed loss of one micro-batch under the run's autocast."""
    with autocast(run.precision, run.device):
        return run.task.loss_sum(run.model, x, y)


def train_step(run: Run, batch: Samples, step: int) -> StepResult:
    """One optimizer step over `batch` (this rank's share of the effective batch)."""
    x_all, y_all = run.task.inputs_and_targets(batch)
    units = run.task.units(y_all)  # on the host tensor: no device sync
    # DDP and FSDP average gradients over ranks, so scale by world / global units for an exact
    # mean.
    divisor = global_sum(units, run.dist, run.device)
    scale = run.dist.world_size / divisor
    plan = run.plan
    parts = list(run.task.micro_batches(x_all, y_all, plan.micro_sizes))
    # A rank with fewer samples than micro-batches runs the rest on one sample at weight 0.
    parts += [first_sample(run, x_all, y_all)] * plan.padding
    total = torch.zeros((), device=run.device)
    for i, (x, y) in enumerate(parts):
        padding = i >= len(parts) - plan.padding
        last = i == len(parts) - 1
        part = micro_step(run, x, y, 0.0 if padding else scale, last, step)
        if not padding:
            total += part
        if i == 0 and not last and run.noise is not None:
            record_small_gradient(run, run.task.units(y), len(y), scale)
    grad_norm = optimizer_step(run, step)
    if run.noise is not None:
        run.noise.step(grad_norm)
    return StepResult(total, units, grad_norm, run.task.tokens(x_all))


def record_small_gradient(run: Run, units: int, samples: int, scale: float | torch.Tensor) -> None:
    """The first micro-batch's mean gradient, for the noise scale: what backward left in the
    gradients is loss_scale x scale x (its summed loss's gradient), and its mean is over its own
    `units`. Not yet reduced across ranks (DDP reduces on the step's last micro-batch)."""
    assert run.noise is not None
    loss_scale = run.scaler.get_scale() if run.scaler else 1.0  # fp16 only: a host sync
    sq = sq_grad_norm(list(run.raw_model.parameters()))
    run.noise.small(sq / (loss_scale * scale * units) ** 2, samples)


def micro_step(
    run: Run, x: Inputs, y: torch.Tensor, scale: float | torch.Tensor, sync: bool, step: int
) -> torch.Tensor:
    """Forward and backward of one micro-batch; the gradients reduced across ranks on the
    step's last. Returns its summed loss (detached)."""
    x, y = move(x, run.device), y.to(run.device, non_blocking=True)
    with no_sync(run.model, sync=sync):
        run.agreement.boundary(run.faults, "forward", len(y), step)
        part = loss_sum(run, x, y)
        run.agreement.boundary(run.faults, "backward", len(y), step)
        scaled = part * scale
        (run.scaler.scale(scaled) if run.scaler else scaled).backward()
    return part.detach()


def first_sample(run: Run, x_all: Inputs, y_all: torch.Tensor) -> tuple[Inputs, torch.Tensor]:
    n = len(y_all)
    return next(iter(run.task.micro_batches(x_all, y_all, [1, n - 1] if n > 1 else [1])))


def optimizer_step(run: Run, step: int) -> torch.Tensor:
    run.agreement.boundary(run.faults, "optimizer", run.plan.micro_batch_size, step)
    if run.scaler:
        run.scaler.unscale_(run.optimizer)
    max_norm = run.cfg.max_grad_norm if run.cfg.max_grad_norm > 0 else math.inf
    grad_norm = torch.nn.utils.clip_grad_norm_(run.raw_model.parameters(), max_norm)
    if run.scaler:
        run.scaler.step(run.optimizer)
        run.scaler.update()
    else:
        run.optimizer.step()
    if run.facts.state_bytes is None:  # once, while the gradients are there to count
        run.facts.state_bytes = measure_state_bytes(run.raw_model, run.optimizer)
    run.optimizer.zero_grad(set_to_none=True)
    run.agreement.settle(step, "updated")
    run.scheduler.step()
    return local_value(grad_norm)


def local_value(t: torch.Tensor) -> torch.Tensor:
    """A replicated DTensor (FSDP's gradient norm) as the plain tensor each rank holds."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t
