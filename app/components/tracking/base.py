"""What every destination of a run's records implements: RunLogger fans out to a list of these.

A sink gets the scalars TensorBoard gets (train/loss, val/loss, system/..., batch/...), free text
(the plan banner), the resolved config with the batch plan once, and the run's end with its
summary. Every method does nothing by default, so a sink implements only what it stores.
"""

from __future__ import annotations

from collections.abc import Mapping

# summary.json status -> did the run end as planned (a tracker's "finished" vs "failed").
COMPLETED = "completed"
STOPPED = ("pruned", "preempted", "paused")  # ended on purpose, not by an error


class Sink:
    name = "sink"  # in the one error line printed when it fails

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Scalars of one step (the same dict for every sink)."""

    def text(self, tag: str, text: str) -> None:
        """Free text, e.g. the run's plan as printed at start."""

    def config(self, config: Mapping[str, object], plan: Mapping[str, object]) -> None:
        """The resolved config (secrets masked) and the batch plan, once, before training."""

    def close(self, summary: Mapping[str, object] | None) -> None:
        """The run's end: flush and close; `summary` is summary.json's content (None if unknown)."""
