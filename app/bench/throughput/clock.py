"""Step timing inside a worker: alone, or in lockstep with the other contenders."""

from __future__ import annotations

import time
from typing import Any


class StepClock:
    """When the steps end, measured with as little disturbance as possible.

    Alone (rounds): timestamps with a device sync only at the first step, the end of the warm-up
    and the last step, so measuring adds nothing to the steps in between; the measured time is
    warm-up end to last step end.

    In lockstep (app/bench/throughput/lockstep.py): the worker passes the baton before its first
    step and after each one, and a step is timed from the parent's go to its end (a device sync
    there, so a GPU does not run on into the next contender's turn). The measured time is the sum
    over the steps after the warm-up, and holds everything the loop does between two steps.
    """

    def __init__(self, start_time: float, warmup: int, total: int, device, baton=None) -> None:
        self.start_time, self.warmup, self.total, self.device = start_time, warmup, total, device
        self.baton = baton
        self.done = 0
        self.first_step_s: float | None = None
        self.t_warm = self.t_end = 0.0  # perf_counter at the end of the warm-up and the last step
        self.peak: tuple[int, str] = (0, "none")
        self.ready_s: float | None = None  # lockstep: launch to ready for the first step
        self.t_go = 0.0
        self.turn_seconds = 0.0  # lockstep: the measured steps' turns
        self.tokens: Any = 0  # the measured steps' tokens that carry data (may be a tensor)
        self.padded: Any = 0  # ... and the tokens computed, padding included

    def count(self, tokens: Any, padded: Any) -> None:
        """Add work done in the current step; counted only when the step is measured. Device
        tensors are summed without a sync and read at the end."""
        if self.done >= self.warmup:
            self.tokens = self.tokens + tokens
            self.padded = self.padded + padded

    def before_step(self) -> None:
        """Call before every step; in lockstep, the first call waits for the first turn."""
        if self.baton is not None and self.ready_s is None:
            self.ready_s = time.time() - self.start_time
            self._pass_baton()

    def step_done(self) -> None:
        self.done += 1
        if self.baton is not None:
            self._turn_done()
            return
        if self.done not in (1, self.warmup, self.total):
            return
        _sync(self.device)
        now = time.perf_counter()
        if self.done == 1:
            self.first_step_s = time.time() - self.start_time
        if self.done == self.warmup:
            self.t_warm = now
        if self.done == self.total:
            self.t_end = now
            self.peak = peak_memory(self.device)

    def _turn_done(self) -> None:
        _sync(self.device)
        seconds = time.perf_counter() - self.t_go
        if self.done == 1:
            self.first_step_s = (self.ready_s or 0.0) + seconds
        if self.done > self.warmup:
            self.turn_seconds += seconds
        if self.done == self.total:
            self.peak = peak_memory(self.device)
        self._pass_baton()  # after the last step: wait to be released, so finishing disturbs none

    def _pass_baton(self) -> None:
        assert self.baton is not None
        self.baton.pass_()
        self.t_go = time.perf_counter()

    def measured_seconds(self) -> float:
        return self.turn_seconds if self.baton is not None else self.t_end - self.t_warm


def _sync(device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def peak_memory(device) -> tuple[int, str]:
    """CUDA max allocated on GPU; on CPU this process's peak RSS (one contender per process)."""
    if device.type == "cuda":
        import torch

        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated"
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "peak_rss"
