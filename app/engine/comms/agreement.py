"""Out-of-memory errors every rank agrees on, so a step can be redone on all ranks together.

Under torchrun a rank that runs out of memory cannot redo a step alone: the others are already
in the step's collectives (DDP's gradient all-reduce, FSDP's all-gathers and reduce-scatters),
and a redo would pair its collectives with theirs out of order. So each rank stops at the
boundary before each phase (the forward and the backward of each micro-batch, the optimizer
step, each evaluation micro-batch) and after the phases that end with no collective of their
own (the optimizer update, an evaluation): one all-reduce of two integers there says whether
any rank failed. If one did, every rank raises `AgreedOOM` at that boundary, before any rank
enters the next collective; all release memory, halve the micro-batch and redo the step.

Injected faults (`faults.*`) fire at these boundaries, on the chosen rank, before the
agreement. A real OOM inside a phase travels up to the recovery, which joins the agreement
the other ranks are waiting in at their next boundary: safe when that phase runs no
collective after the failing allocation (DDP's forward, a backward without gradient sync, the
optimizer update, an evaluation without FSDP). An OOM inside a collective phase (FSDP's
forward, a synchronizing backward) leaves the other ranks in a collective the failed rank never
joins: the process group's timeout ends the run then, not a hang. An OOM inside the optimizer
update, after other ranks may have updated their weights, cannot be redone exactly: every rank
ends the run with TrainingOOM.

The all-reduce runs on the host (a gloo group beside NCCL): an OOM is raised on the host when
the allocator fails, so agreeing needs no device sync, only the hosts meeting.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from app.core.outcomes import TrainingOOM
from app.engine.comms.distributed import host_buffer
from app.engine.faults import FaultInjector


class AgreedOOM(torch.OutOfMemoryError):
    """Raised on every rank at the boundary where the ranks learnt that one ran out."""


class Agreement:
    """This rank's side of the agreement; off (faults raise as they are) in one process or
    when recovery is off, where a boundary only runs the fault check."""

    def __init__(
        self, rank: int = 0, enabled: bool = False, group: dist.ProcessGroup | None = None
    ) -> None:
        self.rank = rank
        self.enabled = enabled
        self.group = group  # a host (gloo) process group; None: the default one
        self.phase = "forward"  # the phase this rank has entered (its last boundary)
        self.step = 0  # ... of this optimizer step (where a lost peer is reported: peers.py)
        self.count = 0  # agreements so far (benchmarks: what it costs per step)

    def boundary(self, faults: FaultInjector, phase: str, micro: int, step: int) -> None:
        """Before `phase`: the injected fault, if it fires here, then the agreement."""
        self.phase, self.step = phase, step
        try:
            faults.check(phase, micro, step)
        except torch.OutOfMemoryError as exc:
            if not self.enabled:
                raise
            self._agree(step, failed=True, inside=False)
            raise AgreedOOM(f"{str(exc).splitlines()[0]} on rank {self.rank}") from None
        if self.enabled:
            self._agree(step, failed=False, inside=False)

    def settle(self, step: int, done: str) -> None:
        """After a phase whose end has no collective (`done`: what ended): did it fail on
        another rank?"""
        self.phase, self.step = done, step
        if self.enabled:
            self._agree(step, failed=False, inside=False)

    def join(self, step: int, error: str = "") -> None:
        """This rank ran out inside its current phase: meet the others at their boundary.
        Returns when the step may be redone; raises TrainingOOM when it may not, or when the
        others cannot be met (they wait inside a collective of the phase, FSDP's all-gathers:
        the agreement's collective fails or times out), so this rank ends as an OOM, not as
        a distributed error."""
        if not self.enabled:
            return
        try:
            self._agree(step, failed=True, inside=self.phase == "optimizer")
        except (TrainingOOM, AgreedOOM):
            raise
        except RuntimeError as exc:  # torch.distributed's errors (DistError) are RuntimeErrors
            raise TrainingOOM(
                f"out of memory on rank {self.rank} inside {self.phase} (step {step}), where "
                f"the other ranks could not be met ({type(exc).__name__}): {error}"
            ) from None

    def _agree(self, step: int, failed: bool, inside: bool) -> None:
        self.count += 1
        flags = host_buffer("agreement", [self.rank + 1 if failed else 0, int(inside)])
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group)
        who, update = (int(v) for v in flags.tolist())
        if update:
            raise TrainingOOM(
                f"out of memory on rank {who - 1} inside the optimizer update of step {step}: "
                "other ranks may have updated their weights, so the step cannot be redone "
                "exactly; resume from the last checkpoint with a smaller "
                "training.micro_batch_size"
            )
        if who and not failed:
            raise AgreedOOM(
                f"out of memory on rank {who - 1} (step {step}; the ranks agreed before "
                f"{self.phase})"
            )
