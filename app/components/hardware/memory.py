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
