"""Fault injection: make chosen micro-batches raise a real torch OutOfMemoryError.

`faults.oom_above_micro_batch=N` fails any micro-batch of more than N samples in the phase
`faults.oom_phase` (forward, backward, optimizer, eval) from optimizer step `faults.oom_from_step`
on. This lets the batch probe and OOM recovery run on a CPU, in tests and for users, exactly as they
would on a GPU that ran out of memory. `faults.kill_in_checkpoint=STEP` SIGKILLs the process while
it writes that step's sharded checkpoint (`faults.kill_rank`: only that rank), as a crash would.
`faults.hang_rank=R` makes rank R stop answering before `faults.hang_phase` of step
`faults.hang_step`: its peers wait for it in their next collective, as for a rank stuck in a
driver call, until `training.peer_timeout_s` ends the run (app/engine/comms/peers.py).
"""

from __future__ import annotations

import logging
import time

import torch

from app.config.training import FaultsConfig

log = logging.getLogger(__name__)


class FaultInjector:
    def __init__(self, cfg: FaultsConfig | None = None, rank: int = 0) -> None:
        self.limit = None if cfg is None else cfg.oom_above_micro_batch
        if cfg is not None and cfg.oom_rank is not None and cfg.oom_rank != rank:
            self.limit = None  # another rank's fault
        self.phase = "forward" if cfg is None else cfg.oom_phase
        self.from_step = 0 if cfg is None else cfg.oom_from_step
        self.fired = 0
        self.kill_step = None if cfg is None else cfg.kill_in_checkpoint
        if cfg is not None and cfg.kill_rank is not None and cfg.kill_rank != rank:
            self.kill_step = None
        hangs = cfg is not None and cfg.hang_rank == rank
        self.hang_at = (cfg.hang_phase, cfg.hang_step) if cfg is not None and hangs else None

    @property
    def active(self) -> bool:
        return self.limit is not None

    def kills_in_checkpoint(self, step: int) -> bool:
        """faults.kill_in_checkpoint: this rank dies while writing this step's checkpoint."""
        return self.kill_step == step

    def check(self, phase: str, micro_batch: int, step: int) -> None:
        if self.hang_at == (phase, step):
            stop_answering(phase, step)
        if self.limit is None or phase != self.phase or step < self.from_step:
            return
        if micro_batch > self.limit:
            self.fired += 1
            raise torch.OutOfMemoryError(
                f"CUDA out of memory (injected: faults.oom_above_micro_batch={self.limit}, "
                f"{phase} of a micro-batch of {micro_batch} at step {step})"
            )


def stop_answering(phase: str, step: int) -> None:
    """faults.hang_rank: never return. Sleeping in short naps keeps the GIL free for the
    rank's watcher threads, as a call stuck in C++ does; a signal's handler runs and the
    nap goes on, as a stop flag nobody reads."""
    log.warning("faults.hang_rank: this rank stops answering before %s of step %d", phase, step)
    while True:
        time.sleep(1.0)
