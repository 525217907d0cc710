"""The CUDA caching allocator's `expandable_segments` option, from `training.expandable_segments`.

With it, the allocator grows one virtual-memory segment instead of reserving fixed blocks, so
memory freed by a shape that is no longer used can serve other shapes: fewer OOMs with "reserved
but unallocated" memory after a change of batch shape (OOM recovery, evaluation, padded data).

The allocator reads its options from the environment once, when CUDA's caching allocator starts
(the first allocation or device query that initializes torch.cuda). So the option is merged into
the environment variable at the very start of a run, before the device is detected, and leaves
the variable's other options alone. The variable rather than `torch.cuda.memory.
_set_allocator_settings`: that function is private (deprecated in torch 2.9 for another private
one), while the variable is the documented interface, honoured by every torch version and
inherited by data-loader workers and subprocesses.
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping

import torch

log = logging.getLogger(__name__)

OPTION = "expandable_segments"
# torch >= 2.9 reads PYTORCH_ALLOC_CONF first; the CUDA-specific name is read by every version.
VARIABLES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


def merged(current: str | None, expandable: bool) -> str:
    """`current` (comma-separated key:value options) with expandable_segments as asked."""
    kept = [
        part.strip()
        for part in (current or "").split(",")
        if part.strip() and part.split(":", 1)[0].strip() != OPTION
    ]
    return ",".join([*kept, f"{OPTION}:{'True' if expandable else 'False'}"])


def target_variable(env: MutableMapping[str, str]) -> str:
    """The variable the allocator will read: PYTORCH_ALLOC_CONF when set, else the CUDA one."""
    return VARIABLES[0] if env.get(VARIABLES[0]) else VARIABLES[1]


def apply_expandable_segments(
    setting: bool | None, env: MutableMapping[str, str] | None = None
) -> str | None:
    """Set the option as configured; null leaves the environment as it is. Returns the
    allocator configuration the run starts with (None: the allocator's defaults)."""
    env = os.environ if env is None else env
    name = target_variable(env)
    if setting is None:
        return env.get(name)
    wanted = merged(env.get(name), setting)
    if env.get(name) != wanted and torch.cuda.is_initialized():
        # An earlier run in this process (a sweep's previous trial) started CUDA already.
        log.warning(
            "training.expandable_segments=%s: CUDA is already initialized in this process, so "
            "the allocator keeps its options; it applies to new processes",
            setting,
        )
    env[name] = wanted
    return wanted
