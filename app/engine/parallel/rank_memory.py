"""Memory per rank: the model state each rank holds (parameters, gradients, optimizer state),
counted on its own tensors (under FSDP, its shards), and its peak memory, gathered to rank 0
for the banner and summary.json."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from app.engine.comms.distributed import DistInfo, host_buffer
from app.engine.records.summary import Summary
from app.engine.run import Run

KINDS = ("parameters", "gradients", "optimizer")


def local_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes this rank holds of `tensors` (a DTensor: its local shard)."""
    return sum(t.numel() * t.element_size() for t in map(_local, tensors))


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def measure_state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """This rank's model state, counted while the step's gradients are still there."""
    params = list(model.parameters())
    state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    sizes = {
        "parameters": local_bytes(params),
        "gradients": local_bytes(p.grad for p in params if p.grad is not None),
        "optimizer": local_bytes(state),
    }
    return {**sizes, "total": sum(sizes.values())}


def expected_state_bytes(model: torch.nn.Module, optimizer_bytes: float) -> dict[str, int]:
    """What this rank will hold before the first step allocates it: its parameters (shards)
    measured, fp32 gradients of the same size, `optimizer_bytes` of state per parameter."""
    params = local_bytes(model.parameters())
    numel = sum(_local(p).numel() for p in model.parameters())
    sizes = {
        "parameters": params,
        "gradients": params,
        "optimizer": int(numel * optimizer_bytes),
    }
    return {**sizes, "total": sum(sizes.values())}


def whole_model_bytes(model: torch.nn.Module) -> int:
    """Bytes of every parameter, unsharded: what one DDP rank holds of them."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def gather_per_rank(value: int, dist: DistInfo) -> list[int]:
    """`value` of every rank, in rank order (a collective: every rank calls it)."""
    if not dist.enabled:
        return [value]
    import torch.distributed as tdist

    # One slot per rank, summed: an all-gather would need a list of fresh tensors, and
    # collective tensors must outlive the group (distributed.host_buffer).
    slots = host_buffer(
        "per_rank", [value if r == dist.rank else 0 for r in range(dist.world_size)]
    )
    tdist.all_reduce(slots, group=dist.host_group)
    return [int(v) for v in slots.tolist()]


def memory_line(state: dict[str, int], whole: int, dist: DistInfo) -> str:
    """The banner's line: this rank's model state and its share of a whole copy's."""
    mib = 2**20
    parts = " + ".join(f"{k} {state[k] / mib:,.2f}" for k in KINDS)
    ratio = state["parameters"] / whole if whole else 1.0
    how = (
        f"{dist.parallelism} over {dist.world_size} rank{'s' if dist.world_size > 1 else ''}"
        if dist.sharded or dist.enabled
        else "one process"
    )
    return (
        f"memory     per rank: model state {state['total'] / mib:,.2f} MiB ({parts}), "
        f"{ratio:.2f}x of a whole copy ({how})"
    )


def record_ranks(run: Run, summary: Summary) -> None:
    """Every rank's peak memory and measured model state into rank 0's summary: a collective,
    called by every rank once the run has completed (all ranks are at the same point)."""
    from app.engine.records.telemetry import peak_memory_bytes

    state = run.facts.state_bytes
    if state is not None:
        summary.model_state_bytes = state
    total = state["total"] if state else 0
    summary.model_state_bytes_per_rank = gather_per_rank(total, run.dist)
    summary.peak_memory_bytes_per_rank = gather_per_rank(peak_memory_bytes(run.device), run.dist)
