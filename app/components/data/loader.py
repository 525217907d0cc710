"""The per-step data loader: item `step` is the whole sample set of optimizer step `step`.

The sample order is a pure function of (seed, step), so resuming at step s, or redoing step s
after an out-of-memory error, sees exactly the samples an uninterrupted run would have seen.

Length-grouped sampling (samples of different lengths, padded per micro-batch): each epoch's
permutation is cut into groups of `group` samples and each group is sorted by length, longest
first, as the transformers Trainer's `group_by_length` does with its megabatches. Consecutive
samples, and so the samples of a step, then have similar lengths and need little padding; the
order is still a pure function of (seed, epoch), so resume and OOM redo stay exact.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset


@functools.lru_cache(maxsize=2)
def _epoch_permutation(num_blocks: int, seed: int, epoch: int) -> torch.Tensor:
    # Cached: consecutive steps mostly fall in the same epoch.
    return torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed + epoch))


def rank_slice(n: int, rank: int, world_size: int) -> slice:
    """Rank `rank`'s contiguous part of a step's n samples; part sizes differ by at most one."""
    base, extra = divmod(n, world_size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (rank < extra))


def rank_share(total: int, world_size: int, rank: int) -> int:
    """How many samples of one optimizer step rank `rank` processes."""
    part = rank_slice(total, rank, world_size)
    return part.stop - part.start


def grouped_by_length(order: torch.Tensor, lengths: torch.Tensor, group: int) -> torch.Tensor:
    """`order` with each run of `group` samples sorted by length, longest first (stable)."""
    parts = []
    for start in range(0, len(order), group):
        chunk = order[start : start + group]
        parts.append(chunk[torch.sort(lengths[chunk], descending=True, stable=True).indices])
    return torch.cat(parts)


def step_sample_indices(
    num_blocks: int,
    samples_per_step: int,
    step: int,
    seed: int,
    epoch_order: Callable[[int], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Sample indices of optimizer step `step`: global samples [step*n, (step+1)*n) of the
    epoch-wise permuted stream, wrapping into the next epoch's permutation. `epoch_order`
    gives an epoch's order (default: a plain permutation)."""
    start, end = step * samples_per_step, (step + 1) * samples_per_step
    return stream_indices(num_blocks, start, end, seed, epoch_order)


def stream_indices(
    num_blocks: int,
    start: int,
    end: int,
    seed: int,
    epoch_order: Callable[[int], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Sample indices of global samples [start, end) of the epoch-wise permuted stream: the
    same samples in the same order whatever the steps that cut it (a batch that changes)."""
    order = epoch_order or (lambda epoch: _epoch_permutation(num_blocks, seed, epoch))
    pos = start
    parts = []
    while pos < end:
        epoch, offset = divmod(pos, num_blocks)
        take = min(end - pos, num_blocks - offset)
        parts.append(order(epoch)[offset : offset + take])
        pos += take
    return torch.cat(parts)


class StepDataset(Dataset):
    """Item `step` = the samples of optimizer step `step` for this rank: `blocks[indices]`
    (int64 [n, seq_len + 1] packed blocks, or padded rows), n = this rank's share of
    `samples_per_step`. With `lengths`, the order is length-grouped in groups of
    `group_steps` steps' samples. `step_span` (a run's loader gives it: its batch may change):
    step -> its global samples [start, end) (app/config/phases.py's BatchPhases.span; the groups
    stay those of `samples_per_step`, the first batch, so the stream does not depend on the
    changes)."""

    def __init__(
        self,
        blocks: Any,
        samples_per_step: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        lengths: torch.Tensor | None = None,
        group_steps: int = 50,
        step_span: Callable[[int], tuple[int, int]] | None = None,
    ) -> None:
        if samples_per_step < world_size:
            raise ValueError(
                f"samples_per_step={samples_per_step} < world_size={world_size}: "
                "some rank would get no samples"
            )
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} not in [0, {world_size})")
        self.blocks = blocks
        self.samples_per_step = samples_per_step
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.lengths = lengths
        self.group = group_steps * samples_per_step
        self.step_span = step_span
        self._orders: dict[int, torch.Tensor] = {}  # epoch -> grouped order (the last two)

    def epoch_order(self, epoch: int) -> torch.Tensor:
        order = _epoch_permutation(len(self.blocks), self.seed, epoch)
        if self.lengths is None:
            return order
        if epoch not in self._orders:
            self._orders = {e: o for e, o in self._orders.items() if e == epoch - 1}
            self._orders[epoch] = grouped_by_length(order, self.lengths, self.group)
        return self._orders[epoch]

    def step_indices(self, step: int) -> torch.Tensor:
        n = self.samples_per_step
        start, end = self.step_span(step) if self.step_span else (step * n, (step + 1) * n)
        idx = stream_indices(len(self.blocks), start, end, self.seed, self.epoch_order)
        return idx[rank_slice(len(idx), self.rank, self.world_size)]

    def __getitem__(self, step: int) -> Any:
        return self.blocks[self.step_indices(step)]


def make_step_loader(
    dataset: StepDataset,
    start_step: int,
    num_steps: int,
    *,
    num_workers: int,
    pin_memory: bool,
    persistent_workers: bool,
    prefetch_factor: int,
) -> DataLoader:
    # batch_size=None: each item is already a whole step; the sampler yields step numbers.
    kwargs: dict[str, Any] = {}
    if num_workers > 0:  # DataLoader rejects these without workers
        kwargs.update(persistent_workers=persistent_workers, prefetch_factor=prefetch_factor)
    return DataLoader(
        dataset,
        batch_size=None,
        sampler=range(start_step, start_step + num_steps),
        num_workers=num_workers,
        pin_memory=pin_memory,  # valid without workers too: the main process pins
        # Its own generator: drawing the workers' base seed from the global RNG would shift
        # dropout masks, and a resumed run would no longer follow the uninterrupted one.
        generator=torch.Generator().manual_seed(dataset.seed),
        **kwargs,
    )


def resolve_num_workers(fixed: int | None, preset_workers: int) -> int:
    """data.num_workers where it is set (`fixed`), else (auto) the preset's, within half the
    CPUs this process may use."""
    if fixed is not None:
        return fixed
    try:
        cpus = len(os.sched_getaffinity(0))  # honours container/taskset CPU limits
    except AttributeError:
        cpus = os.cpu_count() or 1
    return max(0, min(preset_workers, cpus // 2))


def val_batches(val: torch.Tensor, batch_size: int, num_batches: int) -> list[torch.Tensor]:
    """The first `batch_size * num_batches` val blocks (fewer if val is smaller), in order."""
    return [
        val[i : i + batch_size]
        for i in range(0, min(len(val), batch_size * num_batches), batch_size)
    ]
