"""The learning-rate schedule: linear warmup, then cosine or linear decay (or constant)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch


class ScheduleSettings(Protocol):
    """What the schedule reads of `training.*` (TrainingConfig has these fields)."""

    warmup_steps: int
    schedule: str
    max_steps: int
    min_lr_ratio: float


def lr_multiplier(step: int, cfg: ScheduleSettings) -> float:
    """Linear warmup to 1, then cosine/linear decay to min_lr_ratio at max_steps (or constant)."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    span = max(1, cfg.max_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    if cfg.schedule == "linear":
        shape = 1.0 - progress
    else:
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: ScheduleSettings
) -> torch.optim.lr_scheduler.LambdaLR:
    import torch

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_multiplier(step, cfg))
