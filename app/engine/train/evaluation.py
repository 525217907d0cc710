"""Evaluation: the task's metrics over the validation samples, logged, kept in the summary and
reported to the trial (which may prune the run)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from app.components.data.loader import rank_slice
from app.components.hardware.precision import autocast
from app.components.tasks.base import move
from app.core.outcomes import Diverged, Paused, Pruned
from app.engine.batch_plan import eval_padding
from app.engine.comms.agreement import AgreedOOM
from app.engine.comms.distributed import all_reduce_sum, rank0_word, unwrap_ddp, without_autograd
from app.engine.records.summary import Summary
from app.engine.run import Inputs, Run, Samples
from app.engine.train.recovery import release_after_oom, shrink_eval_micro_batch, shrink_micro_batch

GO_ON, PRUNE, PAUSE = 0, 1, 2  # the trial's word on an evaluation (TrialWord.code)


def evaluate(run: Run, step: int) -> float:
    """The validation loss (per target token for causal LM, per sample for classification)."""
    return evaluate_metrics(run, step)["loss"]


def evaluate_metrics(run: Run, step: int) -> dict[str, float]:
    """The task's validation metrics over run.val_blocks: this rank's sums, added up over the
    ranks (the one host sync of the evaluation)."""
    totals = all_reduce_sum(local_sums(run, step), run.dist).tolist()
    return run.task.eval_metrics(totals)


@without_autograd  # inference_mode: no autograd bookkeeping at all, unlike no_grad
def local_sums(run: Run, step: int) -> torch.Tensor:
    """The task's evaluation sums over this rank's share of the validation samples.

    Under DDP each rank evaluates its own contiguous share and the sums are added up over
    ranks: the figures one process gets, for 1/world of the work. The forward goes around the
    DDP wrapper, whose forward may run collectives, because the shares (and so the number of
    batches) can differ by one sample between ranks.
    """
    model = unwrap_ddp(run.model)
    share = run.val_blocks[rank_slice(len(run.val_blocks), run.dist.rank, run.dist.world_size)]
    run.model.eval()
    while True:
        try:
            sums = _eval_sums(run, share, model, step)
            break
        except torch.OutOfMemoryError as exc:
            failed, alone = str(exc).splitlines()[0], not isinstance(exc, AgreedOOM)
        if alone:
            run.agreement.join(step, failed)  # the others wait at their next boundary
        release_after_oom(run)
        run.observers.hooks.on_oom(run, step)
        if run.plan.eval_micro > run.plan.micro_batch_size:
            shrink_eval_micro_batch(run, step)
        else:
            shrink_micro_batch(run, step, failed)
    run.model.train()
    return sums


def _eval_sums(run: Run, share: Samples, model: torch.nn.Module, step: int) -> torch.Tensor:
    x_all, y_all = run.task.inputs_and_targets(share)
    micro = run.plan.eval_micro
    sizes = [min(micro, len(y_all) - start) for start in range(0, len(y_all), micro)]
    sums: torch.Tensor | None = None
    for x, y in run.task.micro_batches(x_all, y_all, sizes):
        run.agreement.boundary(run.faults, "eval", len(y), step)
        part = eval_sums(run, move(x, run.device), y.to(run.device), model)
        sums = part if sums is None else sums + part
    # Every rank runs as many micro-batches as the largest share (FSDP's forwards pair up).
    for _ in range(eval_padding(len(y_all), len(run.val_blocks), run.dist.world_size, micro)):
        sums = padding_sums(run, model, share, step, sums)
    run.agreement.settle(step, "evaluated")
    assert sums is not None  # the validation set is never empty (the data checks it)
    return sums


def padding_sums(
    run: Run, model: torch.nn.Module, share: Samples, step: int, sums: torch.Tensor | None
) -> torch.Tensor:
    """A micro-batch of one sample at weight zero: the sums unchanged."""
    x, y = run.task.inputs_and_targets(share if len(share) else run.val_blocks[:1])
    x, y = next(iter(run.task.micro_batches(x, y, [1, len(y) - 1] if len(y) > 1 else [1])))
    run.agreement.boundary(run.faults, "eval", len(y), step)
    part = eval_sums(run, move(x, run.device), y.to(run.device), model) * 0
    return part if sums is None else sums + part


def eval_sums(run: Run, x: Inputs, y: torch.Tensor, model: torch.nn.Module) -> torch.Tensor:
    """The task's evaluation sums of one micro-batch under the run's autocast."""
    with autocast(run.precision, run.device):
        return run.task.eval_sums(model, x, y)


def eval_and_report(run: Run, step: int, summary: Summary) -> dict[str, float]:
    """Evaluate, log, record in the summary, report to the trial; raises Diverged, or Pruned
    when the trial's pruner says so (never at the last step: that is the trial's result), or
    Paused when hpo.pruner=asha pauses it at a rung, on every rank at the same step. The
    trial hears the budget's mark for this step (app/config/budget.py): the step itself, or
    under a data budget the data seen, the same for trials of every batch size."""
    started = time.perf_counter()
    values = evaluate_metrics(run, step)
    if empties_cache_after_eval(run):
        torch.cuda.empty_cache()
    # Short HPO trials are easily dominated by evaluation: what it cost is in the summary.
    summary.eval_time_s = (summary.eval_time_s or 0.0) + time.perf_counter() - started
    summary.evaluations = (summary.evaluations or 0) + 1
    if not math.isfinite(values["loss"]):
        raise Diverged(f"validation loss is {values['loss']} at step {step}")
    metrics = run.task.metrics
    summary.final_val = {m.name: values[m.name] for m in metrics}
    if run.observers.logger is not None:
        logged = {f"val/{name}": value for name, value in values.items()}
        run.observers.logger.log(step, {**logged, **run.budget.data_seen(step)})
    word = trial_word(run, step, {m.reported: values[m.name] for m in metrics})
    if word.code == PAUSE:  # on every rank: each saves its part of the pause's checkpoint
        raise word.paused or Paused(
            f"paused at step {word.mark} (hpo.pruner=asha), rank 0's word: checkpointed",
            step=word.mark,
        )
    if word.code == PRUNE and step < run.budget.max_steps:
        shown = ", ".join(f"{m.name} {values[m.name]:.4f}" for m in metrics)
        raise Pruned(f"pruned at step {step} with validation {shown}")
    return values


@dataclass(frozen=True)
class TrialWord:
    """What the trial said of an evaluation, the same on every rank: GO_ON, PRUNE or PAUSE
    (at `mark`, the study's step of the rung); `paused`: the reporter's own Paused (rank 0)."""

    code: int
    mark: int = 0
    paused: Paused | None = None


def trial_word(run: Run, step: int, reported: dict[str, float]) -> TrialWord:
    """Rank 0's reporter decides (the others' do nothing); under torchrun every rank must stop
    after the same step, and a pause must be checkpointed by every rank, so rank 0's word
    reaches them all before any acts on it (one host broadcast per evaluation)."""
    pruned, paused = False, None
    try:  # a step that crossed several marks reports at each, up to a pause
        pruned = any([run.observers.reporter.report(m, reported) for m in run.budget.marks(step)])
    except Paused as exc:  # hpo.pruner=asha: a pause at a rung
        paused = exc
    code = PAUSE if paused is not None else PRUNE if pruned else GO_ON
    code, mark = rank0_word([code, paused.step if paused is not None else 0], run.dist)
    return TrialWord(code, mark, paused)


def empties_cache_after_eval(run: Run) -> bool:
    """training.empty_cache_after_eval on a CUDA device: the evaluation's cached blocks go back
    to the driver (for another process on the card, or fragmentation after eval's own shapes)."""
    return bool(run.cfg.empty_cache_after_eval) and run.device.type == "cuda"
