"""The learning-rate schedule: linear warmup, then cosine or linear decay (or constant), over the
data seen: a run whose batch changes (a batch schedule) keeps the shape, and the rate follows
training.lr_scaling at each change."""

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
    def schedule_steps(self) -> int: ...  # where the decay ends, in steps of the first batch
    @property
    def min_lr_ratio(self) -> float: ...
    def position(self, step: int) -> float: ...  # data seen after `step` steps, in first steps
    def lr_scale(self, step: int) -> float: ...  # lr_scaling at step `step`'s batch


def lr_multiplier(step: int, cfg: ScheduleSettings) -> float:
    """The shape (below) at step `step`'s place in the data, times lr_scaling's factor for the
    batch it trains at (1 while the batch has not changed)."""
    return _shape(step, cfg) * cfg.lr_scale(step)


def _shape(step: int, cfg: ScheduleSettings) -> float:
    """Linear warmup to 1, then cosine/linear decay to min_lr_ratio at the budget (or constant),
    on the data seen in steps of the first batch (exactly the steps while the batch is fixed).
    Step `step` trains at the fraction of the warm-up done at its end: under a data budget the
    warm-up is a fraction of steps, and the rate is then the same function of the data seen at
    every batch size."""
    at = cfg.position(step)
    if at < cfg.warmup_steps:
        return min(1.0, cfg.position(step + 1) / cfg.warmup_steps)
    if cfg.schedule == "constant":
        return 1.0
    span = max(1, cfg.schedule_steps - cfg.warmup_steps)
    progress = min(1.0, (at - cfg.warmup_steps) / span)
    if cfg.schedule == "linear":
        shape = 1.0 - progress
    else:
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape


class LrSchedule:
    """The settings the scheduler's multiplier reads, which a change of the batch replaces.
    LambdaLR saves a callable object's attributes with its state, so it is given a plain
    function that reads this instead."""

    def __init__(self, settings: ScheduleSettings) -> None:
        self.settings = settings

    def multiplier(self, step: int) -> float:
        return lr_multiplier(step, self.settings)


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: ScheduleSettings, schedule: LrSchedule | None = None
) -> torch.optim.lr_scheduler.LambdaLR:
    """LambdaLR over `cfg`, or over `schedule` where the caller replaces its settings later."""
    import torch

    reads = schedule or LrSchedule(cfg)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: reads.multiplier(step))
