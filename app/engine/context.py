"""What the runner resolves before it builds a run, in one typed home.

The device, the preset that applies to it, the precision resolved for it, the torchrun ranks and
the task travel together from the runner into the micro-batch probe and its cache key; the
config slices stay plain settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import DictConfig

from app.engine.distributed import DistInfo
from app.components.hardware.devices import DeviceInfo
from app.components.hardware.precision import PrecisionPlan
from app.components.tasks.base import Task


@dataclass
class RunContext:
    cfg: DictConfig  # the composed config
    device: DeviceInfo
    preset: DictConfig  # the gpu preset that applies to this device
    precision: PrecisionPlan
    dist: DistInfo
    task: Task
    warnings: list[str] = field(default_factory=list)  # the banner's and summary.json's
