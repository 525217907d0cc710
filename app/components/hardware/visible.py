"""The GPUs a process may use, found without starting CUDA: a process that starts workers
pinned through CUDA_VISIBLE_DEVICES must not hold a CUDA context of its own."""

from __future__ import annotations

import os

from app.components.hardware.memory import cuda_device_count_without_context


def visible_gpus() -> list[str]:
    """CUDA_VISIBLE_DEVICES' entries where it is set; else every GPU NVML counts; else none."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return [str(i) for i in range(cuda_device_count_without_context())]
    names = []
    for entry in (e.strip() for e in env.split(",")):
        if not entry or entry.startswith("-"):  # CUDA stops at the first invalid entry
            break
        names.append(entry)
    return names
