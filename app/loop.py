"""The training loop: plain settings in, a summary out. No Hydra, no Optuna.

Host-device syncs happen only at log, eval and checkpoint points: losses and grad norms stay on
the device between them.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from omegaconf import DictConfig

from app import checkpoint as ckpt
from app.batch.faults import FaultInjector
from app.batch.plan import BatchPlan, rank_slice
from app.distributed import (
    DistInfo,
    all_reduce_sum,
    any_rank,
    global_sum,
    no_sync,
    unwrap_ddp,
)
from app.hardware.precision import PrecisionPlan
from app.objective import NullReporter, Reporter
from app.outcomes import Diverged, Preempted, Pruned, TrainingOOM
from app.preemption import StopRequest
from app.telemetry import RunLogger, cuda_memory_metrics, mfu, peak_memory_bytes

log = logging.getLogger(__name__)
IGNORE = -100  # a negative token in a block marks padding: no input token, no target


@dataclass
class Run:
    """Everything one training run needs, built by app.train (or a test) and handed to train()."""

    model: torch.nn.Module  # what runs forward: maybe compiled and/or DDP-wrapped
    raw_model: torch.nn.Module  # what is saved and restored
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    plan: BatchPlan
    precision: PrecisionPlan
    device: torch.device
    cfg: DictConfig  # the training slice
    steps: Any  # iterator of host step tensors [per-rank batch, seq_len + 1]
    val_blocks: torch.Tensor
    run_dir: Path
    scaler: torch.amp.GradScaler | None = None
    logger: RunLogger | None = None
    reporter: Reporter = field(default_factory=NullReporter)
    faults: FaultInjector = field(default_factory=FaultInjector)
    dist: DistInfo = field(default_factory=DistInfo)
    start_step: int = 0
    flops_per_token: int | None = None
    peak_tflops: float | None = None
    num_params: int = 0
    on_plan_change: Any = None  # callback(plan) when OOM recovery shrinks the micro-batch
    stop: StopRequest = field(default_factory=StopRequest)  # set by SIGTERM/SIGINT
    config_snapshot: dict[str, Any] = field(default_factory=dict)  # saved with checkpoints
    history: list[dict[str, Any]] = field(default_factory=list)  # what was logged, for tests


def inputs_and_targets(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = blocks[:, :-1], blocks[:, 1:]
    return x.clamp_min(0), y.where(y >= 0, IGNORE)


def autocast(run: Run) -> contextlib.AbstractContextManager:
    if run.precision.autocast_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(run.device.type, dtype=run.precision.autocast_dtype)


def loss_sum(
    run: Run, x: torch.Tensor, y: torch.Tensor, model: torch.nn.Module | None = None
) -> torch.Tensor:
    with autocast(run):
        logits = (run.model if model is None else model)(input_ids=x).logits
    # Summed, not averaged: the caller divides by the target tokens of the whole optimizer step.
    return F.cross_entropy(
        logits.float().flatten(0, 1), y.flatten(), ignore_index=IGNORE, reduction="sum"
    )


def train_step(run: Run, blocks: torch.Tensor, step: int) -> tuple[torch.Tensor, int, torch.Tensor]:
    """One optimizer step over `blocks` (this rank's share of the effective batch)."""
    x_all, y_all = inputs_and_targets(blocks)
    tokens = int((y_all != IGNORE).sum())  # on the host tensor: no device sync
    # DDP averages gradients over ranks, so scale by world / global tokens for an exact token mean.
    divisor = global_sum(tokens, run.dist, run.device)
    scale = run.dist.world_size / divisor
    sizes = run.plan.micro_sizes
    total = torch.zeros((), device=run.device)
    offset = 0
    for i, n in enumerate(sizes):
        x = x_all[offset : offset + n].to(run.device, non_blocking=True)
        y = y_all[offset : offset + n].to(run.device, non_blocking=True)
        offset += n
        with no_sync(run.model, sync=i == len(sizes) - 1):
            run.faults.check("forward", n, step)
            part = loss_sum(run, x, y)
            run.faults.check("backward", n, step)
            scaled = part * scale
            (run.scaler.scale(scaled) if run.scaler else scaled).backward()
        total += part.detach()
    grad_norm = optimizer_step(run, step)
    return total, tokens, grad_norm


def optimizer_step(run: Run, step: int) -> torch.Tensor:
    run.faults.check("optimizer", run.plan.micro_batch_size, step)
    if run.scaler:
        run.scaler.unscale_(run.optimizer)
    max_norm = run.cfg.max_grad_norm if run.cfg.max_grad_norm > 0 else math.inf
    grad_norm = torch.nn.utils.clip_grad_norm_(run.raw_model.parameters(), max_norm)
    if run.scaler:
        run.scaler.step(run.optimizer)
        run.scaler.update()
    else:
        run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    run.scheduler.step()
    return grad_norm


def step_with_recovery(run: Run, blocks: torch.Tensor, step: int):
    """train_step, redone with a smaller micro-batch after an OOM; the effective batch is kept."""
    while True:
        failed = None
        try:
            return train_step(run, blocks, step)
        except torch.OutOfMemoryError as exc:
            failed = str(exc).splitlines()[0]
        # Outside the except block: the traceback no longer pins the failed step's tensors.
        release_after_oom(run)
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


def shrink_micro_batch(run: Run, step: int, error: str | None) -> None:
    """Halve the micro-batch; the accumulation follows from the plan, so the effective batch
    stays exact. Raises TrainingOOM when micro-batch 1 ran out (or recovery is off)."""
    current = run.plan.micro_batch_size
    counts = {"oom_count": run.plan.details.get("oom_count", 0) + 1, **_alloc_retries(run)}
    run.plan.details.update(counts)  # summary.json reports them even when the run ends here
    _log_oom(run, step, counts)
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
    if run.on_plan_change is not None:
        run.on_plan_change(run.plan)


def _alloc_retries(run: Run) -> dict[str, int]:
    # cudaMalloc retries after freeing cached blocks: the allocator's warning sign before an OOM.
    if run.device.type != "cuda":
        return {}
    return {"alloc_retries": int(torch.cuda.memory_stats(run.device).get("num_alloc_retries", 0))}


def _log_oom(run: Run, step: int, counts: dict[str, int]) -> None:
    metrics = {f"train/{k}": float(v) for k, v in counts.items()}
    run.history.append({"step": step, **metrics})
    if run.logger is not None:
        run.logger.log(step, metrics)


@torch.no_grad()
def evaluate(run: Run, step: int) -> float:
    """Mean validation loss per target token.

    Under DDP each rank evaluates its own contiguous share of the validation blocks and the sums
    are added up over ranks: the figure one process gets, for 1/world of the work. The forward
    goes around the DDP wrapper, whose forward may run collectives, because the shares (and so
    the number of batches) can differ by one block between ranks.
    """
    model = unwrap_ddp(run.model)
    share = run.val_blocks[rank_slice(len(run.val_blocks), run.dist.rank, run.dist.world_size)]
    run.model.eval()
    total = torch.zeros((), device=run.device, dtype=torch.float64)
    tokens = 0
    while True:
        try:
            for start in range(0, len(share), run.plan.micro_batch_size):
                chunk = share[start : start + run.plan.micro_batch_size]
                run.faults.check("eval", len(chunk), step)
                x, y = inputs_and_targets(chunk)
                total += loss_sum(run, x.to(run.device), y.to(run.device), model)
                tokens += int((y != IGNORE).sum())
            break
        except torch.OutOfMemoryError as exc:
            failed = str(exc).splitlines()[0]
        release_after_oom(run)
        shrink_micro_batch(run, step, failed)
        total.zero_()
        tokens = 0
    run.model.train()
    sums = torch.stack([total, torch.tensor(float(tokens), device=run.device, dtype=total.dtype)])
    loss, count = all_reduce_sum(sums, run.dist).tolist()  # the one host sync of the evaluation
    return loss / max(count, 1.0)


def save(run: Run, step: int) -> None:
    if not run.dist.is_main:
        return
    state = {
        "model": run.raw_model.state_dict(),
        "optimizer": run.optimizer.state_dict(),
        "scheduler": run.scheduler.state_dict(),
        "scaler": run.scaler.state_dict() if run.scaler else {},
        "step": step,  # optimizer steps done; the data position follows from it
        "rng": ckpt.rng_state(),
        "plan": run.plan.as_dict(),
        "config": run.config_snapshot,  # what shaped the model: a resume is checked against it
    }
    ckpt.save_checkpoint(run.run_dir / "checkpoints", step, state, run.cfg.keep_checkpoints)


def restore(run: Run, state: dict[str, Any]) -> None:
    run.raw_model.load_state_dict(state["model"])
    run.optimizer.load_state_dict(state["optimizer"])
    run.scheduler.load_state_dict(state["scheduler"])
    if run.scaler is not None and state.get("scaler"):
        run.scaler.load_state_dict(state["scaler"])
    ckpt.set_rng_state(state["rng"])
    run.start_step = int(state["step"])


class Throughput:
    """Tokens/s over log windows, excluding eval and checkpoint time.

    Wall time is read only at log points, just after the window's one host sync (the loss
    `.item()`), so it is exact without a per-step synchronize. Step timing uses marks: a CUDA
    event recorded on the stream (no sync) or, on CPU, a host clock reading, taken by
    `mark_step()` after each step and at window edges. Their elapsed times are read only in
    `close_window()`, when the events have completed, so reading them never waits either.
    """

    def __init__(self, device: torch.device | None = None) -> None:
        self.window_start = time.perf_counter()
        self.paused = 0.0
        self.windows: list[tuple[int, float]] = []  # (tokens, seconds)
        self.device = device
        # ("origin" | "step" | "end", mark): a step is timed from the mark before it.
        self._marks: list[tuple[str, Any]] = [] if device is None else [("origin", self._mark())]
        self.step_times: list[float] = []  # of the last closed window, when steps were marked
        self.device_seconds: float | None = None  # of the last closed window

    def _mark(self) -> Any:
        if self.device is not None and self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def mark_step(self) -> None:
        if self.device is not None:
            self._marks.append(("step", self._mark()))

    @contextlib.contextmanager
    def pause(self):
        t0 = time.perf_counter()
        yield
        self.paused += time.perf_counter() - t0
        if self._marks:  # the next step is timed from here, not across the eval
            self._marks.append(("origin", self._mark()))

    def close_window(self, tokens: int, device: torch.device | None = None) -> float:
        """Close the window (call after a host sync); returns its wall seconds."""
        now = time.perf_counter()
        seconds = max(now - self.window_start - self.paused, 1e-9)
        self.windows.append((tokens, seconds))
        self.window_start, self.paused = now, 0.0
        if self.device is None and device is not None:
            self.device = device  # timed from the next window on
        self._read_marks()
        return seconds

    def _read_marks(self) -> None:
        self.step_times, self.device_seconds = [], None
        if self.device is None:
            return
        self._marks.append(("end", self._mark()))
        if self.device.type == "cuda":
            self._marks[-1][1].synchronize()  # already done: the caller synced for the loss
        segments = [
            (kind, _elapsed(a, b))
            for (_, a), (kind, b) in zip(self._marks, self._marks[1:], strict=False)
            if kind != "origin"
        ]
        self.step_times = [s for kind, s in segments if kind == "step"]
        self.device_seconds = sum(s for _, s in segments) if segments else None
        self._marks = [("origin", self._marks[-1][1])]

    def steady_tokens_per_sec(self) -> float | None:
        # The first window holds compilation, cudnn autotuning and allocator warm-up.
        windows = self.windows[1:] or self.windows
        if not windows:
            return None
        return sum(t for t, _ in windows) / sum(s for _, s in windows)


def _elapsed(start: Any, end: Any) -> float:
    if isinstance(start, float):
        return end - start
    return start.elapsed_time(end) / 1000.0  # CUDA events: milliseconds


def train(run: Run, summary: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run to max_steps; return the summary (`summary`, filled as the run goes, so it holds the
    progress when the run ends early). Raises Pruned, Diverged, TrainingOOM or Preempted."""
    cfg = run.cfg
    summary = {} if summary is None else summary
    summary.update(initial_val_loss=None, final_val_loss=None, steps=run.start_step)
    tokens_per_step = run.plan.effective_batch_size * (run.val_blocks.shape[1] - 1)
    if run.start_step == 0 and cfg.eval_at_start:
        summary["initial_val_loss"] = _eval_and_report(run, 0, summary)
    meter = Throughput(run.device)
    window = {"loss": torch.zeros((), device=run.device), "tokens": 0, "steps": 0}
    bar = _progress(run)
    grad_norm = torch.zeros(())
    try:
        for step in range(run.start_step, cfg.max_steps):
            blocks = next(run.steps)
            loss, tokens, grad_norm = step_with_recovery(run, blocks, step)
            meter.mark_step()  # a CUDA event (no sync) or a clock reading, read at the log point
            window["loss"] += loss
            window["tokens"] += tokens
            window["steps"] += 1
            done = step + 1
            if done % cfg.log_every == 0 or done == cfg.max_steps:
                _log_window(run, done, window, meter, grad_norm, tokens_per_step, summary, bar)
            if done % cfg.eval_every == 0 or done == cfg.max_steps:
                with meter.pause():
                    _eval_and_report(run, done, summary)
            summary["steps"] = done
            summary["tokens_per_sec"] = meter.steady_tokens_per_sec()
            saved = done == cfg.max_steps or bool(
                cfg.checkpoint_every and done % cfg.checkpoint_every == 0
            )
            if saved:
                with meter.pause():
                    save(run, done)
            if bar is not None:
                bar.update(1)
            if done < cfg.max_steps and stop_requested(run):
                stop_here(run, done, saved)
    finally:
        if bar is not None:
            bar.close()
    return summary


def stop_requested(run: Run) -> bool:
    """A signal asked this run to stop. Under DDP every rank must stop after the same step,
    so the ranks agree on it: one small all-reduce per step, and only under torchrun."""
    return any_rank(run.stop.requested, run.dist, run.device)


def stop_here(run: Run, done: int, saved: bool) -> None:
    if not saved:
        save(run, done)
    signal = run.stop.name if run.stop.requested else "a stop on another rank"
    raise Preempted(
        f"{signal}: stopped after step {done} of {run.cfg.max_steps} with a checkpoint; "
        "training.resume=auto (same run dir) or training.resume=<run dir> continues exactly",
        signum=run.stop.signum or 15,
        step=done,
    )


def _log_window(run, done, window, meter, grad_norm, tokens_per_step, summary, bar) -> None:
    train_loss = window["loss"].item() / max(window["tokens"], 1)  # the one sync of the window
    if not math.isfinite(train_loss):
        raise Diverged(f"train loss is {train_loss} at step {done}")
    seconds = meter.close_window(window["steps"] * tokens_per_step, run.device)
    step_time = seconds / window["steps"]
    tok_s = tokens_per_step / step_time
    metrics: dict[str, float | None] = {
        "train/loss": train_loss,
        "train/learning_rate": run.scheduler.get_last_lr()[0],
        "train/grad_norm": float(grad_norm),
        "train/step_time_s": step_time,
        "train/samples_per_sec": run.plan.effective_batch_size / step_time,
        "train/tokens_per_sec": tok_s,
        "train/micro_batch_size": float(run.plan.micro_batch_size),
        "train/grad_accum_steps": float(run.plan.grad_accum_steps),
        "train/mfu": _mfu(run, tok_s),
    }
    metrics.update(_step_timing(meter, window["steps"]))
    if run.device.type == "cuda":
        metrics.update(cuda_memory_metrics(run.device))
    else:
        metrics["system/peak_rss_mb"] = peak_memory_bytes(run.device) / 2**20
    summary["final_train_loss"] = train_loss
    run.history.append({"step": done, **metrics})
    if run.logger is not None:
        run.logger.log(done, metrics)
    if bar is not None:
        bar.set_postfix(loss=f"{train_loss:.4f}", tok_s=f"{tok_s:,.0f}", refresh=False)
    window["loss"].zero_()
    window["tokens"] = window["steps"] = 0


def _step_timing(meter: Throughput, steps: int) -> dict[str, float]:
    """Device-side step time (CUDA events) and the slowest step, when the loop marks steps."""
    out = {}
    if meter.device_seconds is not None:
        out["train/device_step_time_s"] = meter.device_seconds / steps
    if meter.step_times:
        out["train/step_time_max_s"] = max(meter.step_times)
    return out


def _mfu(run: Run, tokens_per_sec: float) -> float | None:
    if run.flops_per_token is None:
        return None
    return mfu(tokens_per_sec / run.dist.world_size, run.flops_per_token, run.peak_tflops)


def _eval_and_report(run: Run, step: int, summary: dict[str, Any]) -> float:
    val_loss = evaluate(run, step)
    if not math.isfinite(val_loss):
        raise Diverged(f"validation loss is {val_loss} at step {step}")
    summary["final_val_loss"] = val_loss
    metrics = {"val/loss": val_loss, "val/perplexity": math.exp(min(val_loss, 50.0))}
    run.history.append({"step": step, **metrics})
    if run.logger is not None:
        run.logger.log(step, metrics)
    if run.reporter.report(step, {"val_loss": val_loss, "final_val_loss": val_loss}):
        raise Pruned(f"pruned at step {step} with validation loss {val_loss:.4f}")
    return val_loss


def _progress(run: Run):
    if not (run.cfg.progress_bar and run.dist.is_main):
        return None
    from tqdm.auto import tqdm

    return tqdm(
        total=run.cfg.max_steps,
        initial=run.start_step,
        desc="train",
        unit="step",
        dynamic_ncols=True,
        mininterval=1.0,
    )


def peak_memory(run: Run) -> int:
    return peak_memory_bytes(run.device)
