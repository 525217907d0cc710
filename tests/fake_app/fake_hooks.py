"""A conditional search space for the hook test: warmup is searched only for large batches."""

from __future__ import annotations

from typing import Any


def batch_dependent_warmup(cfg: Any, trial: Any) -> dict[str, Any]:
    batch = trial.params["training.effective_batch_size"]
    if batch >= 64:
        trial.suggest_int("training.warmup_steps", 10, 50)
        return {}
    return {"training.warmup_steps": 0}  # a fixed value, not a searched parameter
