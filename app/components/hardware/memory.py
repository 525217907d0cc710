"""How much memory the machine has, without importing torch or creating a CUDA context."""

from __future__ import annotations

import os


def host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def cuda_total_memory_without_context() -> int | None:
    """This rank's card's memory from NVML (None: no driver, no NVML or no such device)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(int(os.environ.get("LOCAL_RANK", "0")))
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
    except Exception:
        return None


def cuda_device_count_without_context() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:
        return 0


def nvml_name_and_memory(device: int | str) -> tuple[str, int] | None:
    """The name and total memory of a GPU from NVML: an index, or a CUDA_VISIBLE_DEVICES entry
    (an index or a UUID). None without a driver, NVML or such a device (a MIG slice: torch
    still answers)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        if isinstance(device, str) and not device.isdigit():
            handle = pynvml.nvmlDeviceGetHandleByUUID(device)
        else:
            handle = pynvml.nvmlDeviceGetHandleByIndex(int(device))
        name = pynvml.nvmlDeviceGetName(handle)
        total = pynvml.nvmlDeviceGetMemoryInfo(handle).total
        return (name.decode() if isinstance(name, bytes) else name), int(total)
    except Exception:
        return None
