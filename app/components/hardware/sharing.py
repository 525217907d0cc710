"""A GPU that several trials share: its memory and the preset's headroom, found without starting
CUDA (a sweep worker must not hold a CUDA context on the GPU its trials use). Each trial's
process is then held to what it reserved (`gpu.memory_limit_gib`, `devices.detect_device`).

NVML numbers the physical GPUs: a CUDA_VISIBLE_DEVICES entry (an index or a UUID) names one
of them, whatever this process's own CUDA_VISIBLE_DEVICES says.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from app.components.hardware.config import GpuConfig
from app.components.hardware.memory import nvml_name_and_memory
from app.core.errors import ConfigError

GIB = 2**30


@dataclass(frozen=True)
class SharedGpu:
    """What the trials on one GPU (or one group of a multi-rank trial's GPUs) share."""

    devices: str  # CUDA_VISIBLE_DEVICES of the group
    name: str  # the card's name, or "unknown" where NVML does not answer
    memory_bytes: int  # hpo.gpu_memory_gib, else the card's (the smallest of the group)
    headroom: float  # the preset's memory_headroom: kept free, as the batch probe keeps it


def shared_gpu(devices: str, gpu: Mapping[str, object], memory_gib: float | None) -> SharedGpu:
    """The GPU(s) `devices` names as trials share it: `memory_gib` (hpo.gpu_memory_gib) stands
    for the card's memory where set (part of a card, or a fake GPU on a machine without one);
    `gpu` is the sweep's `gpu` node (gpu=auto: the preset matching the card's name)."""
    cards = [nvml_name_and_memory(d) for d in devices.split(",")]
    known = [c for c in cards if c is not None]
    name = known[0][0] if known else "unknown"
    if memory_gib is not None:
        memory = int(memory_gib * GIB)
    elif known and len(known) == len(cards):
        memory = min(total for _, total in known)
    else:
        raise ConfigError(
            f"hpo.trials_per_gpu=auto: NVML does not report the memory of device {devices}; "
            "allowed: hpo.gpu_memory_gib=<GiB of each GPU>, or an integer hpo.trials_per_gpu"
        )
    return SharedGpu(devices, name, memory, _headroom(gpu, name))


def _headroom(gpu: Mapping[str, object], card: str) -> float:
    """The preset's memory_headroom; gpu=auto (or no gpu node): the preset of the card."""
    default = GpuConfig(name="auto")
    if gpu.get("device_type", default.device_type) == "auto":
        # devices imports torch: a sweep process (a fleet's parent, before it starts its
        # workers) must not pay that at start-up
        from app.components.hardware.devices import load_presets, match_preset

        preset = match_preset(card, load_presets())
        if preset is not None:
            return float(preset.memory_headroom)
    value = gpu.get("memory_headroom", default.memory_headroom)
    return float(value) if isinstance(value, int | float) else default.memory_headroom
