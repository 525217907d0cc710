"""The peak memory of one probe candidate: on CUDA the peak reserved memory (plus what other
processes hold) over the device's memory or the cap gpu.memory_limit_gib sets; on CPU the
process's peak RSS over system memory."""

from __future__ import annotations

import contextlib
import gc
import resource
from pathlib import Path

import torch

from app.components.hardware.devices import DeviceInfo
from app.components.hardware.memory import host_memory_bytes


class MemoryMeter:
    """Peak memory of one candidate as a fraction of the device's (CPU: the system's) total, or
    of the cap gpu.memory_limit_gib sets."""

    def __init__(self, device: DeviceInfo) -> None:
        self.device = device.torch_device
        if self.device.type == "cuda":
            free, card = torch.cuda.mem_get_info(self.device)
            # Memory other processes (and other allocators) hold counts against the margin too.
            others = card - free - torch.cuda.memory_reserved(self.device)
            # gpu.memory_limit_gib: this process's share of a GPU that trials share. What the
            # others hold within the rest of the card is theirs; only more than that counts.
            limit = device.memory_limit_bytes
            self.total = card if limit is None else limit
            self.elsewhere = max(0, others - (card - self.total))
        else:
            self.total = host_memory_bytes()
            self.elsewhere = 0

    def reset(self) -> None:
        if self.device.type == "cuda":
            gc.collect()  # so the cached blocks of dead tensors can be returned
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            reset_host_peak()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def peak_fraction(self) -> float:
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_reserved(self.device)
        else:
            peak = host_peak_bytes()
        return (self.elsewhere + peak) / self.total


def reset_host_peak() -> None:
    # Linux: writing 5 resets this process's peak RSS (VmHWM); elsewhere it stays cumulative.
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def host_peak_bytes() -> int:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
