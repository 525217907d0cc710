"""Which micro-batch a probe's results (fresh or cached) pick: pure rules, the same for both.

A candidate fails on an OOM or when its peak memory leaves less free than the margin. With
`throughput_aware`, the fitting sizes in the top half are compared in samples/s and the fastest
wins, near-ties going to the larger; the micro-batch is then trimmed to the largest size of its
split (32 samples at most 12 per micro-batch run as 11+11+10, so the plan says 11).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from app.components.hardware.config import GpuConfig
from app.components.hardware.devices import DeviceInfo
from app.config.training import AutoBatchConfig
from app.core.outcomes import TrainingOOM
from app.engine.batch.cache import Trials, fits_below_failure
from app.engine.batch_plan import fit_split
from app.engine.comms.distributed import DistInfo
from app.engine.records.batch import Candidate

TIE = 0.03  # samples/s within 3% count as a tie (timing noise): the larger micro-batch wins
TIMED_SIZES = 3  # split sizes timed near the top


def memory_limit(device: DeviceInfo, preset: GpuConfig, ab: AutoBatchConfig) -> float:
    """Largest fraction of device (CPU: system) memory a candidate's peak may use."""
    if device.type == "cpu":
        return float(ab.cpu_memory_fraction)
    return 1.0 - float(preset.memory_headroom)


def split_candidates(per_rank: int, top: int) -> list[int]:
    """Distinct split sizes at most `top` and at least top/2, largest first."""
    sizes: list[int] = []
    count = math.ceil(per_rank / top)
    while len(sizes) < TIMED_SIZES and count <= per_rank:
        size = math.ceil(per_rank / count)
        if 2 * size < top:
            break
        if size not in sizes:
            sizes.append(size)
        count += 1
    return sizes


def choose(
    trials: Trials, limit: float, upper: int, per_rank: int, throughput_aware: bool
) -> tuple[int, str]:
    """(micro-batch, how it was chosen); raises TrainingOOM when not even 1 fits."""
    fits, first_fail = fits_below_failure(trials, limit, upper)
    if not fits:
        raise TrainingOOM(
            f"micro-batch 1 does not fit in memory (first failure at {first_fail}); "
            "use a smaller model, data.seq_len, gradient checkpointing or lower precision"
        )
    top = fits[-1]
    if not throughput_aware:
        return fit_split(per_rank, top), "largest"
    timed = {m: sps for m in fits if 2 * m >= top and (sps := trials[m].get("samples_per_sec"))}
    if len(timed) < 2:
        return fit_split(per_rank, top), "largest"
    best = max(timed.values())
    pick = max(m for m, sps in timed.items() if sps >= best * (1 - TIE))
    return fit_split(per_rank, pick), "throughput"


@dataclass(frozen=True)
class Chooser:
    """The rule of one run's choice: its memory limit, the largest micro-batch it may pick, a
    rank's share, by throughput or the largest; the same size on every rank."""

    limit: float
    largest: int
    per_rank: int
    throughput_aware: bool
    dist: DistInfo
    device: torch.device

    def choose(self, trials: Trials) -> tuple[int, str]:
        """(micro-batch, how it was chosen); raises TrainingOOM when not even 1 fits."""
        t = self.throughput_aware
        micro, chosen_by = choose(trials, self.limit, self.largest, self.per_rank, t)
        return agree_across_ranks(micro, self.dist, self.device), chosen_by

    def pick(self, trials: Trials) -> int | None:
        """The micro-batch chosen, or None where none fits."""
        if not fits_below_failure(trials, self.limit, self.largest)[0]:
            return None
        return self.choose(trials)[0]


def candidate_rows(trials: Trials, limit: float) -> list[Candidate]:
    fits, _ = fits_below_failure(trials, limit, max(trials, default=0))
    return [
        Candidate(
            micro=m,
            fits=m in fits,
            oom=bool(t.get("oom")),
            peak_fraction=t.get("peak_fraction"),
            samples_per_sec=t.get("samples_per_sec"),
        )
        for m, t in sorted(trials.items())
    ]


def agree_across_ranks(micro: int, dist: DistInfo, device: torch.device) -> int:
    # Ranks probe their own device; every rank must use the size the tightest one can afford.
    if not dist.enabled:
        return micro
    import torch.distributed as tdist

    value = torch.tensor(micro, device=device)
    tdist.all_reduce(value, op=tdist.ReduceOp.MIN)
    return int(value)
