"""A run's effective batch over its optimizer steps, in phases: one for a fixed batch, more where
the batch grows during the run (a batch schedule). Each phase starts at an optimizer-step
boundary, so the data seen after any step is exact: the phases' steps times their batches, summed.

The phases are the one place that maps steps to data and back; a budget in data, the points it
logs, evaluates and checkpoints at, and the learning-rate schedule read them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Phase:
    step: int  # the first optimizer step (0-based) trained at this batch
    samples: int  # the samples seen, all ranks, before that step
    batch: int  # the effective batch from that step on


@dataclass(frozen=True)
class BatchPhases:
    """The phases in order of their first step; the first starts at step 0."""

    phases: tuple[Phase, ...]

    def __post_init__(self) -> None:
        if not self.phases or self.phases[0].step != 0 or self.phases[0].samples != 0:
            raise ValueError(f"the first phase must start at step 0 with no data seen: {self}")
        for before, after in zip(self.phases, self.phases[1:], strict=False):
            if after.step <= before.step or after.samples != self._end(before, after.step):
                raise ValueError(f"phase {after} does not follow {before}")
        if any(p.batch < 1 for p in self.phases):
            raise ValueError(f"a phase's batch must be at least 1: {self}")

    @classmethod
    def fixed(cls, batch: int) -> BatchPhases:
        return cls((Phase(0, 0, batch),))

    @property
    def first(self) -> Phase:
        return self.phases[0]

    @property
    def last(self) -> Phase:
        return self.phases[-1]

    def at(self, step: int) -> Phase:
        """The phase optimizer step `step` (0-based) trains in."""
        for phase in reversed(self.phases):
            if phase.step <= step:
                return phase
        raise ValueError(f"step {step} is before the first phase")

    def batch_at(self, step: int) -> int:
        return self.at(step).batch

    def samples_seen(self, done: int) -> int:
        """Samples seen, all ranks, after `done` optimizer steps."""
        return self._end(self.at(done), done)

    def span(self, step: int) -> tuple[int, int]:
        """Optimizer step `step`'s samples in the run's stream: [seen before it, seen after it)."""
        return self.samples_seen(step), self.samples_seen(step + 1)

    def steps_to(self, samples: int) -> int:
        """The fewest steps after which at least `samples` are seen (past the last phase's
        start, at its batch: a later change moves it)."""
        ends = [p.samples for p in self.phases[1:]]
        for phase, end in zip(self.phases, [*ends, None], strict=True):
            if end is None or samples <= end:
                return phase.step + max(0, math.ceil((samples - phase.samples) / phase.batch))
        raise AssertionError("unreachable: the last phase has no end")

    def with_batch_from(self, step: int, batch: int) -> BatchPhases:
        """These phases with `batch` from optimizer step `step` on: a step at or after the last
        phase's first (a phase starting at that same step is replaced)."""
        last = self.last
        if step < last.step:
            raise ValueError(f"a change at step {step} is before the last phase's {last}")
        kept = self.phases[:-1] if step == last.step else self.phases
        return BatchPhases((*kept, Phase(step, self.samples_seen(step), batch)))

    def to_json(self) -> list[dict[str, int]]:
        """As summary.json and a checkpoint keep them: one {step, samples, batch} per phase."""
        return [{"step": p.step, "samples": p.samples, "batch": p.batch} for p in self.phases]

    @classmethod
    def from_json(cls, rows: list[dict[str, int]]) -> BatchPhases:
        return cls(tuple(Phase(int(r["step"]), int(r["samples"]), int(r["batch"])) for r in rows))

    @staticmethod
    def _end(phase: Phase, done: int) -> int:
        return phase.samples + (done - phase.step) * phase.batch
