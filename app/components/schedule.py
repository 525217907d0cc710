"""The learning-rate schedule: linear warmup, then cosine or linear decay (or constant)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch


class ScheduleSettings(Protocol):
    """What the schedule reads: the run's TrainBudget (app/config/budget.py) has these fields."""

    @property
    def warmup_steps(self) -> float: ...  # fractional under a data budget (an uneven batch)
    @property
    def schedule(self) -> str: ...
    @property
    def max_steps(self) -> int: ...
    @property
    def min_lr_ratio(self) -> float: ...


def lr_multiplier(step: int, cfg: ScheduleSettings) -> float:
    """Linear warmup to 1, then cosine/linear decay to min_lr_ratio at max_steps (or constant).
    Step `step` trains at the fraction of the warm-up done at its end: under a data budget the
    warm-up is a fraction of steps, and the rate is then the same function of the data seen at
    every batch size."""
    if step < cfg.warmup_steps:
        return min(1.0, (step + 1) / cfg.warmup_steps)
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
