"""Out-of-memory recovery: a step that ran out is redone from the same data with half the
micro-batch, and the accumulation follows from the plan, so the effective batch and the
trajectory stay exact. Evaluation that ran out shrinks its own micro-batch first. Under torchrun
the ranks agree on the error first (app/engine/comms/agreement.py), so they all shrink and redo the
step together."""

from __future__ import annotations

import gc
import logging
from collections import defaultdict
from dataclasses import replace

import torch

from app.core.outcomes import TrainingOOM
from app.engine.comms.agreement import AgreedOOM
from app.engine.comms.distributed import no_sync
from app.engine.records.batch import OomRecord
from app.engine.run import Run, Samples
from app.engine.train.step import StepResult, first_sample, loss_sum, train_step

log = logging.getLogger(__name__)


def step_with_recovery(run: Run, batch: Samples, step: int) -> StepResult:
    """train_step, redone with a smaller micro-batch after an OOM; the effective batch is kept."""
    while True:
        run.observers.hooks.on_attempt(run, step)
        failed, alone = None, False
        try:
            return train_step(run, batch, step)
        except torch.OutOfMemoryError as exc:
            failed, alone = str(exc).splitlines()[0], not isinstance(exc, AgreedOOM)
        # Outside the except block: the traceback no longer pins the failed step's tensors.
        if alone:
            run.agreement.join(step, failed)  # the others wait at their next boundary
        release_after_oom(run, batch)
        run.observers.hooks.on_oom(run, step)
        shrink_micro_batch(run, step, failed)


def release_after_oom(run: Run, batch: Samples | None = None) -> None:
    """Drop what the failed attempt holds; with FSDP, also what FSDP holds for it (`batch`: a
    training step's, whose accumulated gradients must go)."""
    run.optimizer.zero_grad(set_to_none=True)
    if run.scaler is not None:
        # Forget a half-done unscale_/step so the retried step starts clean.
        run.scaler._per_optimizer_states = defaultdict(
            torch.amp.grad_scaler._refresh_per_optimizer_state
        )
    # Collectives: only where every rank is here too (agreed, or alone in the world).
    if run.dist.sharded and (run.agreement.enabled or not run.dist.enabled):
        discard_fsdp_attempt(run, batch)
    gc.collect()
    if run.device.type == "cuda":
        torch.cuda.empty_cache()


def discard_fsdp_attempt(run: Run, batch: Samples | None) -> None:
    """FSDP keeps a step's gradients unsharded, outside `.grad`, until the micro-batch that
    reduce-scatters them; reset_iter_state() reshards but keeps them (torch 2.13), and a redo
    would add them twice. One micro-batch of one sample at weight zero, with the reduction on,
    moves them into the sharded `.grad`, which zero_grad then drops. Every rank runs it: the
    ranks agreed on the error, so they are here together."""
    from torch.distributed.fsdp import FSDPModule

    root = run.raw_model
    assert isinstance(root, FSDPModule)
    root.reset_iter_state()
    if batch is None:
        return
    x, y = first_sample(run, *run.task.inputs_and_targets(batch))
    x, y = x.to(run.device), y.to(run.device)
    with no_sync(run.model, sync=True):
        (loss_sum(run, x, y) * 0.0).backward()
    run.optimizer.zero_grad(set_to_none=True)


def count_oom(run: Run, step: int) -> OomRecord:
    """One more OOM in the plan's record (summary.json reports them even when the run ends
    here) and in the logs; returns the record."""
    ooms = replace(run.plan.ooms, count=run.plan.ooms.count + 1, alloc_retries=_alloc_retries(run))
    run.plan.ooms = ooms
    if run.observers.logger is not None:
        counts = {"oom_count": ooms.count, "alloc_retries": ooms.alloc_retries}
        figures = {f"train/{k}": float(v) for k, v in counts.items() if v is not None}
        run.observers.logger.log(step, figures)
    return ooms


def shrink_micro_batch(run: Run, step: int, error: str | None) -> None:
    """Halve the micro-batch; the accumulation follows from the plan, so the effective batch
    stays exact. Raises TrainingOOM when micro-batch 1 ran out (or recovery is off)."""
    current = run.plan.micro_batch_size
    ooms = count_oom(run, step)
    if current <= 1 or not run.cfg.auto_batch.oom_recovery:
        raise TrainingOOM(f"out of memory at micro-batch {current} (step {step}): {error}")
    smaller = max(1, current // 2)
    struck = replace(ooms, at_step=step, reduced_from=current)
    run.plan = run.plan.with_micro_batch(smaller, "reduced_after_oom", struck)
    if run.plan.micro_ceiling is not None:  # an adaptive batch never grows back past it
        run.plan.micro_ceiling = min(run.plan.micro_ceiling, smaller)
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
    its own, so this is safe under torchrun too. Raises TrainingOOM when recovery is off (under
    torchrun no rank agreed then, and one evaluating again alone would meet its peers'
    collectives out of order)."""
    count_oom(run, step)
    if not run.cfg.auto_batch.oom_recovery:
        raise TrainingOOM(
            f"out of memory in evaluation at micro-batch {run.plan.eval_micro} (step {step}); "
            "training.auto_batch.oom_recovery is off"
        )
    smaller = max(run.plan.micro_batch_size, run.plan.eval_micro // 2)
    log.warning(
        "OOM in evaluation at step %d with micro-batch %d: evaluating with %d",
        step,
        run.plan.eval_micro,
        smaller,
    )
    run.plan = run.plan.with_eval_micro_batch(smaller)


def _alloc_retries(run: Run) -> int | None:
    # cudaMalloc retries after freeing cached blocks: the allocator's warning sign before an OOM.
    if run.device.type != "cuda":
        return None
    return int(torch.cuda.memory_stats(run.device).get("num_alloc_retries", 0))
