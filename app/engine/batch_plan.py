"""The batch plan: micro-batch x accumulation x world size == effective batch, exactly.

When the per-rank batch is not a multiple of the micro-batch, the step is split into micro-batches
whose sizes differ by at most one (32 with micro 5 -> 5,5,5,5,4,4,4), never rounded to a nearby
effective batch. The loss is normalized by the target tokens of the whole step, so an uneven split
gives the same gradient as an even one.

Under torchrun every rank runs the same number of micro-batches, the number the largest share
needs: FSDP's forwards are collectives, and the ranks agree on out-of-memory errors before each
micro-batch, so their micro-batches must pair up. A share one sample smaller is split into as
many parts (9 over 2 ranks at micro-batch 2: 2,2,1 and 2,1,1); at micro-batch 1 it runs one
micro-batch of weight zero (`padding`), which adds nothing to the gradient.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

from app.components.data.loader import rank_share
from app.config.training import EvalMicroBatch
from app.core.errors import ConfigError
from app.engine.records.batch import BatchDetails, OomRecord, ProbeReport


def split_sizes(total: int, max_micro: int) -> list[int]:
    """Sizes of the fewest micro-batches of at most `max_micro` that sum to `total`, within one."""
    if total < 1 or max_micro < 1:
        raise ValueError(f"cannot split {total} samples into micro-batches of {max_micro}")
    return split_even(total, math.ceil(total / max_micro))


def fit_split(per_rank: int, micro: int) -> int:
    """The largest micro-batch of the split `micro` gives: 32 at most 12 -> 11+11+10 -> 11."""
    return math.ceil(per_rank / math.ceil(per_rank / micro))


def split_even(total: int, count: int) -> list[int]:
    """`total` samples in `count` micro-batches whose sizes differ by at most one."""
    base, extra = divmod(total, count)
    return [base + 1] * extra + [base] * (count - extra)


def eval_padding(share: int, total: int, world_size: int, micro: int) -> int:
    """Evaluation micro-batches of weight zero a rank with `share` of `total` validation samples
    runs so that every rank runs as many as the largest share needs (its shares differ by one)."""
    largest = math.ceil(total / world_size)
    return math.ceil(largest / micro) - math.ceil(share / micro)


# training.eval_micro_batch_size=auto: evaluation runs EVAL_FACTOR times the training
# micro-batch (no backward, no saved activations); the probe evaluates at that size too.
EVAL_FACTOR = 4


def eval_micro_size(setting: EvalMicroBatch, micro: int) -> int | None:
    """training.eval_micro_batch_size for a training micro-batch: None (evaluate at the training
    micro-batch), EVAL_FACTOR times it (auto), or the size set."""
    return EVAL_FACTOR * micro if setting.scaled else setting.size


@dataclass
class BatchPlan:
    effective_batch_size: int
    micro_batch_size: int  # the largest micro-batch; the others are at most one smaller
    world_size: int = 1
    rank: int = 0
    source: str = "fixed"  # fixed | probed | cached | reduced_after_oom
    probe: ProbeReport | None = None  # training.micro_batch_size=auto
    ooms: OomRecord = field(default_factory=OomRecord)
    eval_micro_batch_size: int | None = None  # None: the training micro-batch
    # An adaptive batch's room to grow: the largest micro-batch the probe found fits (and an
    # OOM since then left standing); None: the micro-batch stays as the batch grows.
    micro_ceiling: int | None = None

    @property
    def details(self) -> BatchDetails:
        """The probe's report and the OOMs: summary.json's batch_details."""
        return BatchDetails(self.probe, self.ooms)

    @property
    def eval_micro(self) -> int:
        return self.eval_micro_batch_size or self.micro_batch_size

    @property
    def per_rank_batch(self) -> int:
        return rank_share(self.effective_batch_size, self.world_size, self.rank)

    @property
    def micro_count(self) -> int:
        """Micro-batches per step, the same on every rank: what the largest share needs."""
        largest = math.ceil(self.effective_batch_size / self.world_size)
        return math.ceil(largest / self.micro_batch_size)

    @property
    def micro_sizes(self) -> list[int]:
        """This rank's micro-batches: its share in micro_count parts (fewer if it is smaller)."""
        share = self.per_rank_batch
        return split_even(share, min(self.micro_count, share))

    @property
    def padding(self) -> int:
        """Micro-batches of weight zero that make this rank's count micro_count."""
        return self.micro_count - len(self.micro_sizes)

    @property
    def grad_accum_steps(self) -> int:
        return self.micro_count

    def with_micro_batch(self, micro: int, source: str, ooms: OomRecord | None = None) -> BatchPlan:
        """The plan with another training micro-batch; a larger evaluation micro-batch shrinks
        in proportion (what did not fit in training will not fit in evaluation either)."""
        evaluation = self.eval_micro_batch_size
        if evaluation is not None:
            evaluation = max(micro, evaluation * micro // self.micro_batch_size)
        return replace(
            self,
            micro_batch_size=micro,
            source=source,
            ooms=self.ooms if ooms is None else ooms,
            eval_micro_batch_size=evaluation,
        )

    def at_batch(self, batch: int, two_per_step: bool) -> BatchPlan:
        """The plan at a larger effective batch (an adaptive schedule's doubling): the
        micro-batch grows with the share, up to micro_ceiling (at most half the share where the
        noise scale needs two micro-batches a step), so a step runs as few micro-batches as fit;
        without a ceiling, or at it, only the accumulation grows. A deterministic function of
        the batch, so a resumed run lands on the micro-batch the uninterrupted one reached."""
        plan = replace(self, effective_batch_size=batch)
        if self.micro_ceiling is None or batch <= self.effective_batch_size:
            return plan
        share = math.ceil(batch / self.world_size)
        top = min(self.micro_ceiling, share // 2 if two_per_step else share)
        if top <= self.micro_batch_size:
            return plan
        return plan.with_micro_batch(fit_split(share, top), self.source)

    def with_eval_micro_batch(self, micro: int | None) -> BatchPlan:
        return replace(self, eval_micro_batch_size=micro)

    def describe(self) -> str:
        sizes = self.micro_sizes
        even = len(set(sizes)) == 1
        split = f"{sizes[0]} x {len(sizes)}" if even else f"{'+'.join(map(str, sizes))}"
        split += f" + {self.padding} of weight 0" if self.padding else ""
        evaluation = (
            f"; evaluation micro-batch {self.eval_micro_batch_size}"
            if self.eval_micro_batch_size
            else ""
        )
        return (
            f"micro-batch {self.micro_batch_size} ({self.source}), accumulation "
            f"{self.grad_accum_steps} [{split}] x world {self.world_size} = effective "
            f"{self.effective_batch_size}{evaluation}"
        )

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = asdict(self)
        del out["probe"], out["ooms"]
        out["details"] = self.details.to_json()
        out["grad_accum_steps"] = self.grad_accum_steps
        out["micro_batch_sizes"] = self.micro_sizes
        return out


def fixed_plan(effective: int, micro: int, world_size: int, rank: int) -> BatchPlan:
    if effective < world_size:
        raise ConfigError(
            f"training.effective_batch_size={effective} is smaller than the world size "
            f"{world_size}; every rank needs at least one sample per step"
        )
    # Capped by the largest share, not this rank's: every rank's plan names the same size.
    largest = math.ceil(effective / world_size)
    return BatchPlan(effective, min(micro, largest), world_size, rank, "fixed")
