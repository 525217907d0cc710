"""The adaptive batch schedule's rule: when to double the effective batch.

The gradient noise scale B_simple predicts the critical batch (McCandlish et al. 2018): below it
a larger batch cuts the steps to a loss nearly in proportion, above it it mostly spends more data.
It grows as the loss falls, so a batch fixed for the whole run is too large early and too small
late. The rule doubles the batch when the smoothed noise scale has stayed at or above
`fraction` x the current batch for `patience` samples on end, up to `max_batch`: with
`fraction` = 2 the doubled batch is still at or below the measured critical batch. Waiting out
`patience` keeps one noisy reading from moving the batch, and each doubling starts the wait again
(the estimate at the new batch is judged on its own).

The rule is host arithmetic on readings taken where the run already syncs; the loop's side (when
it reads, where the batch changes) is app/engine/train/batch_growth.py. `BatchGrowth` is what a
run holds of the schedule.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypedDict

from app.components.schedule import LrSchedule
from app.config.budget import TrainBudget

# (first step, budget) -> the steps' samples from that step on (app/engine/step_data.py);
# Any: the samples' type is the run's (app/engine/run.py), which holds this module's BatchGrowth
StepsFrom = Callable[[int, TrainBudget], Iterator[Any]]


@dataclass(frozen=True)
class RampRule:
    fraction: float  # double when the noise scale >= fraction x the current batch ...
    patience: int  # ... for this many samples on end
    max_batch: int  # never past this effective batch
    smoothing: float  # the noise scale's moving-average factor per step, as the rule reads it


@dataclass
class BatchRamp:
    """The rule's state over a run: since when (samples seen) the noise scale has stayed above
    the bar at the current batch, None while it is not."""

    rule: RampRule
    above_since: int | None = None

    def observe(self, noise: float | None, samples: int, batch: int) -> int | None:
        """A reading of the noise scale (None: not estimated yet) after `samples` seen at
        effective batch `batch`. Returns the batch to train at from the next step where the
        rule doubles it, else None."""
        doubled = 2 * batch
        if doubled > self.rule.max_batch or noise is None or noise < self.rule.fraction * batch:
            self.above_since = None
            return None
        if self.above_since is None:
            self.above_since = samples
        if samples - self.above_since < self.rule.patience:
            return None
        self.above_since = None  # the wait starts again at the new batch
        return doubled

    def state_dict(self) -> dict[str, int | None]:
        return {"above_since": self.above_since}

    def load_state_dict(self, state: dict[str, int | None]) -> None:
        above = state["above_since"]
        self.above_since = None if above is None else int(above)


class GrowthState(TypedDict):
    """What a checkpoint keeps of the schedule (TrainState.batch_schedule)."""

    phases: list[dict[str, int]]
    above_since: int | None


@dataclass
class BatchGrowth:
    """The adaptive schedule of one run: the rule's state, the learning-rate schedule whose
    settings each change replaces, and how to restart the data at a step."""

    ramp: BatchRamp
    schedule: LrSchedule
    steps_from: StepsFrom
    changes: list[str] = field(default_factory=list)  # one line per change, as printed

    def describe(self, budget: TrainBudget) -> str:
        """The banner's line: the rule, and where the batch is now."""
        rule, phases = self.ramp.rule, budget.batch_phases
        now = f", now {phases.last.batch}" if len(phases.phases) > 1 else ""
        return (
            f"adaptive batch from {phases.first.batch}{now}: doubled "
            f"once the noise scale (averaged over ~{1 / (1 - rule.smoothing):.0f} steps) has "
            f"stayed >= {rule.fraction:g} x the batch for "
            f"{rule.patience:,} samples, up to {rule.max_batch}; the steps to the budget "
            "shrink as it grows"
        )

    def state_dict(self, budget: TrainBudget) -> GrowthState:
        """The phases so far and the rule's wait, for a checkpoint of `budget`'s run."""
        return GrowthState(phases=budget.batch_phases.to_json(), above_since=self.ramp.above_since)

    def load_state_dict(self, state: dict[str, object]) -> None:
        above = state.get("above_since")
        self.ramp.above_since = None if above is None else int(above)  # type: ignore[call-overload]
