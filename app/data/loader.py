"""The per-step data loader: item `step` is the whole sample set of optimizer step `step`.

The sample order is a pure function of (seed, step), so resuming at step s, or redoing step s
after an out-of-memory error, sees exactly the samples an uninterrupted run would have seen.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from app.batch.plan import rank_slice


@functools.lru_cache(maxsize=2)
def _epoch_permutation(num_blocks: int, seed: int, epoch: int) -> torch.Tensor:
    # Cached: consecutive steps mostly fall in the same epoch.
    return torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed + epoch))


def step_sample_indices(
    num_blocks: int, samples_per_step: int, step: int, seed: int
) -> torch.Tensor:
    """Block indices of optimizer step `step`: global samples [step*n, (step+1)*n) of the
    epoch-wise permuted stream, wrapping into the next epoch's permutation."""
    pos, end = step * samples_per_step, (step + 1) * samples_per_step
    parts = []
    while pos < end:
        epoch, offset = divmod(pos, num_blocks)
        take = min(end - pos, num_blocks - offset)
        parts.append(_epoch_permutation(num_blocks, seed, epoch)[offset : offset + take])
        pos += take
    return torch.cat(parts)


class StepDataset(Dataset):
    """Item `step` = the sample blocks of optimizer step `step` for this rank.

    Each item is int64 [n, seq_len + 1], n = this rank's share of `samples_per_step`.
    """

    def __init__(
        self,
        blocks: torch.Tensor,
        samples_per_step: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
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

    def step_indices(self, step: int) -> torch.Tensor:
        idx = step_sample_indices(len(self.blocks), self.samples_per_step, step, self.seed)
        return idx[rank_slice(len(idx), self.rank, self.world_size)]

    def __getitem__(self, step: int) -> torch.Tensor:
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


def resolve_num_workers(setting: int | str, preset_workers: int) -> int:
    if setting != "auto":
        return int(setting)
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
