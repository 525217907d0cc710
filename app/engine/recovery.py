"""Out-of-memory recovery: a step that ran out is redone from the same data with half the
micro-batch, and the accumulation follows from the plan, so the effective batch and the
trajectory stay exact. Evaluation that ran out shrinks its own micro-batch first."""

from __future__ import annotations

import gc
import logging
from collections import defaultdict
from typing import Any

import torch

from app.core.outcomes import TrainingOOM
from app.engine.run import Run
from app.engine.step import StepResult, train_step

log = logging.getLogger(__name__)


def step_with_recovery(run: Run, batch: Any, step: int) -> StepResult:
    """train_step, redone with a smaller micro-batch after an OOM; the effective batch is kept."""
    while True:
        run.observers.hooks.on_attempt(run, step)
        failed = None
        try:
            return train_step(run, batch, step)
        except torch.OutOfMemoryError as exc:
            failed = str(exc).splitlines()[0]
        # Outside the except block: the traceback no longer pins the failed step's tensors.
        release_after_oom(run)
        run.observers.hooks.on_oom(run, step)
        shrink_micro_batch(run, step, failed)


def release_after_oom(run: Run) -> None:
    run.optimizer.zero_grad(set_to_none=True)
    if run.scaler is not None:
        # Forget a half-done unscale_/step so the retried step starts clean.
        run.scaler._per_optimizer_states = defaultdict(
            torch.amp.grad_scaler._refresh_per_optimizer_state
        )
    gc.collect()
    if run.device.type == "cuda":
        torch.cuda.empty_cache()


def count_oom(run: Run, step: int) -> dict[str, int]:
    """One more OOM in the plan's details (summary.json reports them even when the run ends
    here) and in the logs; returns the counts."""
    counts = {"oom_count": run.plan.details.get("oom_count", 0) + 1, **_alloc_retries(run)}
    run.plan.details.update(counts)
    if run.observers.logger is not None:
        run.observers.logger.log(step, {f"train/{k}": float(v) for k, v in counts.items()})
    return counts


def shrink_micro_batch(run: Run, step: int, error: str | None) -> None:
    """Halve the micro-batch; the accumulation follows from the plan, so the effective batch
    stays exact. Raises TrainingOOM when micro-batch 1 ran out (or recovery is off)."""
    current = run.plan.micro_batch_size
    counts = count_oom(run, step)
    if current <= 1 or not run.cfg.auto_batch.oom_recovery:
        raise TrainingOOM(f"out of memory at micro-batch {current} (step {step}): {error}")
    if run.dist.enabled:
        # The other ranks are already inside this step's collectives: a redo here would pair
        # its collectives with theirs out of order (gloo aborts on the mismatch; NCCL may hang
        # or mix buffers). End the run cleanly instead; torchrun then stops the other ranks.
        raise TrainingOOM(
            f"out of memory on rank {run.dist.rank} at micro-batch {current} (step {step}); "
            "under torchrun a step cannot be redone on one rank alone: rerun with "
            f"training.micro_batch_size={max(1, current // 2)} ({error})"
        )
    smaller = max(1, current // 2)
    run.plan = run.plan.with_micro_batch(
        smaller, "reduced_after_oom", oom_at_step=step, reduced_from=current, **counts
    )
    log.warning(
        "OOM at step %d with micro-batch %d: retrying the step with %d (%s)",
        step,
        current,
        smaller,
        run.plan.describe(),
    )
    if run.observers.on_plan_change is not None:
        run.observers.on_plan_change(run.plan)


def shrink_eval_micro_batch(run: Run, step: int) -> None:
    """Evaluation ran out with a micro-batch larger than training's: halve it (not below the
    training micro-batch, which is known to fit) and evaluate again. Each rank evaluates on
    its own, so this is safe under torchrun too."""
    count_oom(run, step)
    smaller = max(run.plan.micro_batch_size, run.plan.eval_micro // 2)
    log.warning(
        "OOM in evaluation at step %d with micro-batch %d: evaluating with %d",
        step,
        run.plan.eval_micro,
        smaller,
    )
    run.plan = run.plan.with_eval_micro_batch(smaller)


def _alloc_retries(run: Run) -> dict[str, int]:
    # cudaMalloc retries after freeing cached blocks: the allocator's warning sign before an OOM.
    if run.device.type != "cuda":
        return {}
    return {"alloc_retries": int(torch.cuda.memory_stats(run.device).get("num_alloc_retries", 0))}
