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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch
from omegaconf import DictConfig

from app.engine import checkpoint as ckpt
from app.engine.batch.faults import FaultInjector
from app.engine.batch.plan import BatchPlan, rank_slice
from app.engine.distributed import (
    DistInfo,
    all_reduce_sum,
    any_rank,
    global_sum,
    no_sync,
    unwrap_ddp,
)
from app.components.hardware.precision import PrecisionPlan, autocast
from app.hpo import NullReporter, Reporter
from app.core.outcomes import Diverged, Preempted, Pruned, TrainingOOM
from app.core.preemption import StopRequest
from app.engine.profiling import StepProfiler
from app.components.tasks.base import Task, move
from app.components.tasks.causal_lm import CausalLM
from app.engine.telemetry import RunLogger, cuda_memory_metrics, mfu, peak_memory_bytes

log = logging.getLogger(__name__)
IGNORE = -100  # causal LM: a negative token in a block marks padding (app/tasks/causal_lm.py)


@dataclass
class Observers:
    """Where a run reports to; each is optional and does nothing by default."""

    logger: RunLogger | None = None  # TensorBoard + metrics.jsonl, on the main rank
    reporter: Reporter = field(default_factory=NullReporter)  # the HPO trial, if any
    on_plan_change: Callable[[BatchPlan], None] | None = None  # OOM recovery teaches the cache
    stop: StopRequest = field(default_factory=StopRequest)  # set by SIGTERM/SIGINT


@dataclass
class ModelFacts:
    """Fixed facts about the model: throughput figures and what checkpoints record."""

    num_params: int = 0  # N of the FLOPs formula (app/model.py model_shape)
    flops_per_token: int | None = None
    peak_tflops: float | None = None  # of this device at this precision; None: MFU unknown
    identity: dict[str, Any] = field(default_factory=dict)  # the settings that shape it
    tokenizer: str | None = None  # the fingerprint of <run dir>/tokenizer (app/export.py)


@dataclass
class Run:
    """Everything one training run needs, built by app.engine.runner (or a test) and handed to train()."""

    model: torch.nn.Module  # what runs forward: maybe compiled and/or DDP-wrapped
    raw_model: torch.nn.Module  # what is saved and restored
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    plan: BatchPlan
    precision: PrecisionPlan
    device: torch.device
    cfg: DictConfig  # the training slice
    steps: Any  # iterator of this rank's host step batches (the task's sample type)
    val_blocks: Any  # validation samples: packed blocks (causal LM) or padded rows
    run_dir: Path
    task: Task = field(default_factory=CausalLM)
    scaler: torch.amp.GradScaler | None = None
    faults: FaultInjector = field(default_factory=FaultInjector)
    dist: DistInfo = field(default_factory=DistInfo)
    start_step: int = 0  # optimizer steps already done (a resumed run)
    observers: Observers = field(default_factory=Observers)
    facts: ModelFacts = field(default_factory=ModelFacts)
    history: list[dict[str, Any]] = field(default_factory=list)  # what was logged, for tests


class StepResult(NamedTuple):
    loss_sum: torch.Tensor  # on the device: summed over the step's units
    units: int  # what the loss is averaged over (target tokens, samples)
    grad_norm: torch.Tensor
    tokens: int  # input tokens that carry data, for tokens/s


def inputs_and_targets(batch: Any, task: Task | None = None) -> tuple[Any, torch.Tensor]:
    return (task or CausalLM()).inputs_and_targets(batch)


def loss_sum(run: Run, x: Any, y: torch.Tensor, model: torch.nn.Module | None = None):
    """The task's summed loss of one micro-batch under the run's autocast."""
    with autocast(run.precision, run.device):
        return run.task.loss_sum(run.model if model is None else model, x, y)


def train_step(run: Run, batch: Any, step: int) -> StepResult:
    """One optimizer step over `batch` (this rank's share of the effective batch)."""
    x_all, y_all = run.task.inputs_and_targets(batch)
    units = run.task.units(y_all)  # on the host tensor: no device sync
    # DDP averages gradients over ranks, so scale by world / global units for an exact mean.
    divisor = global_sum(units, run.dist, run.device)
    scale = run.dist.world_size / divisor
    sizes = run.plan.micro_sizes
    total = torch.zeros((), device=run.device)
    for i, (x, y) in enumerate(run.task.micro_batches(x_all, y_all, sizes)):
        x, y = move(x, run.device), y.to(run.device, non_blocking=True)
        with no_sync(run.model, sync=i == len(sizes) - 1):
            run.faults.check("forward", len(y), step)
            part = loss_sum(run, x, y)
            run.faults.check("backward", len(y), step)
            scaled = part * scale
            (run.scaler.scale(scaled) if run.scaler else scaled).backward()
        total += part.detach()
    grad_norm = optimizer_step(run, step)
    return StepResult(total, units, grad_norm, run.task.tokens(x_all))


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


def _count_oom(run: Run, step: int) -> dict[str, int]:
    """One more OOM in the plan's details (summary.json reports them even when the run ends
    here) and in the logs; returns the counts."""
    counts = {"oom_count": run.plan.details.get("oom_count", 0) + 1, **_alloc_retries(run)}
    run.plan.details.update(counts)
    _log_oom(run, step, counts)
    return counts


def shrink_micro_batch(run: Run, step: int, error: str | None) -> None:
    """Halve the micro-batch; the accumulation follows from the plan, so the effective batch
    stays exact. Raises TrainingOOM when micro-batch 1 ran out (or recovery is off)."""
    current = run.plan.micro_batch_size
    counts = _count_oom(run, step)
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
    _count_oom(run, step)
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


def _log_oom(run: Run, step: int, counts: dict[str, int]) -> None:
    metrics = {f"train/{k}": float(v) for k, v in counts.items()}
    run.history.append({"step": step, **metrics})
    if run.observers.logger is not None:
        run.observers.logger.log(step, metrics)


def evaluate(run: Run, step: int) -> float:
    """The validation loss (per target token for causal LM, per sample for classification)."""
    return evaluate_metrics(run, step)["loss"]


@torch.inference_mode()  # no autograd bookkeeping at all, unlike no_grad
def evaluate_metrics(run: Run, step: int) -> dict[str, float]:
    """The task's validation metrics over run.val_blocks.

    Under DDP each rank evaluates its own contiguous share of the validation samples and the
    sums are added up over ranks: the figures one process gets, for 1/world of the work. The
    forward goes around the DDP wrapper, whose forward may run collectives, because the shares
    (and so the number of batches) can differ by one sample between ranks.
    """
    model = unwrap_ddp(run.model)
    share = run.val_blocks[rank_slice(len(run.val_blocks), run.dist.rank, run.dist.world_size)]
    run.model.eval()
    while True:
        try:
            sums = _eval_sums(run, share, model, step)
            break
        except torch.OutOfMemoryError as exc:
            failed = str(exc).splitlines()[0]
        release_after_oom(run)
        if run.plan.eval_micro > run.plan.micro_batch_size:
            shrink_eval_micro_batch(run, step)
        else:
            shrink_micro_batch(run, step, failed)
    run.model.train()
    totals = all_reduce_sum(sums, run.dist).tolist()  # the one host sync of the evaluation
    return run.task.eval_metrics(totals)


def _eval_sums(run: Run, share: Any, model: torch.nn.Module, step: int) -> torch.Tensor:
    x_all, y_all = run.task.inputs_and_targets(share)
    micro = run.plan.eval_micro
    sizes = [min(micro, len(y_all) - start) for start in range(0, len(y_all), micro)]
    sums = None
    for x, y in run.task.micro_batches(x_all, y_all, sizes):
        run.faults.check("eval", len(y), step)
        part = eval_sums(run, move(x, run.device), y.to(run.device), model)
        sums = part if sums is None else sums + part
    return sums


def eval_sums(run: Run, x: Any, y: torch.Tensor, model: torch.nn.Module) -> torch.Tensor:
    """The task's evaluation sums of one micro-batch under the run's autocast."""
    with autocast(run.precision, run.device):
        return run.task.eval_sums(model, x, y)


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
        "config": run.facts.identity,  # what shaped the model: a resume is checked against it
        "tokenizer_sha256": run.facts.tokenizer,  # which tokenizer the export pairs it with
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

    def skip_window(self) -> None:
        """Drop a window that holds no counted step (profiled steps only): the next window
        starts now, and the steady figure never sees this one."""
        self.window_start, self.paused = time.perf_counter(), 0.0
        if self.device is not None:
            self._marks = [("origin", self._mark())]

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

    def training_seconds(self) -> float:
        """Seconds spent in optimizer steps so far (closed windows; no eval, no checkpoints)."""
        return sum(s for _, s in self.windows)

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
    for m in run.task.metrics:
        summary[f"initial_val_{m.name}"] = summary[f"final_val_{m.name}"] = None
    summary["steps"] = run.start_step
    summary["tokens_per_sec"], summary["train_time_s"] = None, 0.0  # until a window closes
    if run.start_step == 0 and cfg.eval_at_start:
        values = _eval_and_report(run, 0, summary)
        summary.update({f"initial_val_{m.name}": values[m.name] for m in run.task.metrics})
    meter = Throughput(run.device)
    window = Window(torch.zeros((), device=run.device))
    last, log_every, eval_every = cfg.max_steps, cfg.log_every, cfg.eval_every
    checkpoint_every = cfg.checkpoint_every  # config reads, once: not at every step
    profiler = StepProfiler(
        cfg.profiler, run.run_dir, run.device, last, run.dist.rank, resumed_at=run.start_step
    )
    bar = _progress(run)
    try:
        for step in range(run.start_step, last):
            batch = next(run.steps)
            if profiler.covers(step):
                window.add(profiled_step(run, batch, step, meter, profiler), counted=False)
                summary["profile"] = profiler.describe()
            else:
                window.add(step_with_recovery(run, batch, step))
                meter.mark_step()  # a CUDA event (no sync) or a clock reading, read at log points
            done = step + 1
            if done % log_every == 0 or done == last:
                _log_window(run, done, window, meter, summary, bar)
            summary["steps"] = done  # before the evaluation: a trial pruned there trained `done`
            if evaluates_at(done, eval_every, last):
                with meter.pause():
                    _eval_and_report(run, done, summary)
            saved = done == last or bool(checkpoint_every and done % checkpoint_every == 0)
            if saved:
                with meter.pause():
                    save(run, done)
            if bar is not None:
                bar.update(1)
            if done < last and stop_requested(run):
                stop_here(run, done, saved)
    finally:
        # Once, however the run ends (only a closed window changes them; nothing reads them
        # while it runs): a pass over every window at each log point would grow with the run.
        summary["tokens_per_sec"] = meter.steady_tokens_per_sec()
        summary["train_time_s"] = meter.training_seconds()
        profiler.close()  # a run that ends inside the window still writes its trace
        if bar is not None:
            bar.close()
    return summary


def evaluates_at(done: int, every: int, last: int) -> bool:
    """Evaluation after optimizer step `done`: every `every` steps, and at the last."""
    return done % every == 0 or done == last


def evaluations_after(start: int, every: int, last: int) -> int:
    """How many of steps start+1 .. last evaluate (evaluates_at), counted without a pass."""
    return last // every - start // every + (last % every != 0) if start < last else 0


def profiled_step(
    run: Run, batch: Any, step: int, meter: Throughput, profiler: StepProfiler
) -> StepResult:
    """One step under the profiler, kept out of the throughput figures: recording slows it
    several-fold. The device is synced on both sides so the pause holds exactly this step's
    work; the earlier steps' queued work is timed in their own window."""
    synchronize(run.device)
    with meter.pause():
        profiler.before_step(step)
        result = step_with_recovery(run, batch, step)
        synchronize(run.device)
        profiler.after_step(step)
    return result


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def stop_requested(run: Run) -> bool:
    """A signal asked this run to stop. Under DDP every rank must stop after the same step,
    so the ranks agree on it: one small all-reduce per step, and only under torchrun."""
    return any_rank(run.observers.stop.requested, run.dist, run.device)


def stop_here(run: Run, done: int, saved: bool) -> None:
    if not saved:
        save(run, done)
    stop = run.observers.stop
    signal = stop.name if stop.requested else "a stop on another rank"
    raise Preempted(
        f"{signal}: stopped after step {done} of {run.cfg.max_steps} with a checkpoint; "
        "training.resume=auto (same run dir) or training.resume=<run dir> continues exactly",
        signum=stop.signum or 15,
        step=done,
    )


@dataclass
class Window:
    """What the loop adds up between two log points; read (one host sync) at the log point."""

    loss: torch.Tensor  # on the device: summed over `units`
    units: int = 0
    tokens: int = 0  # this rank's, of the steps that count toward throughput
    steps: int = 0  # ... and those steps
    grad_norm: torch.Tensor | None = None  # the last step's

    def add(self, result: StepResult, counted: bool = True) -> None:
        """A step's loss always counts; its tokens only when its time does (not profiled)."""
        self.loss += result.loss_sum
        self.units += result.units
        self.grad_norm = result.grad_norm
        if counted:
            self.tokens += result.tokens
            self.steps += 1

    def reset(self) -> None:
        self.loss.zero_()
        self.units = self.tokens = self.steps = 0


def _log_window(run: Run, done: int, window: Window, meter, summary, bar) -> None:
    train_loss = window.loss.item() / max(window.units, 1)  # the window's host sync
    if not math.isfinite(train_loss):
        raise Diverged(f"train loss is {train_loss} at step {done}")
    metrics: dict[str, float | None] = {
        "train/loss": train_loss,
        "train/learning_rate": run.scheduler.get_last_lr()[0],
        "train/grad_norm": float(window.grad_norm),
        "train/micro_batch_size": float(run.plan.micro_batch_size),
        "train/grad_accum_steps": float(run.plan.grad_accum_steps),
    }
    tok_s = _throughput(run, window, meter, metrics)
    if run.device.type == "cuda":
        metrics.update(cuda_memory_metrics(run.device))
    else:
        metrics["system/peak_rss_mb"] = peak_memory_bytes(run.device) / 2**20
    summary["final_train_loss"] = train_loss
    run.history.append({"step": done, **metrics})
    if run.observers.logger is not None:
        run.observers.logger.log(done, metrics)
    if bar is not None:
        postfix = {"loss": f"{train_loss:.4f}"}
        if tok_s is not None:
            postfix["tok_s"] = f"{tok_s:,.0f}"
        bar.set_postfix(postfix, refresh=False)
    window.reset()


def _throughput(run: Run, window: Window, meter: Throughput, metrics: dict) -> float | None:
    """The window's speed figures into `metrics`; tokens/s, or None for a window of profiled
    steps only, which has nothing to count."""
    tokens = int(global_sum(window.tokens, run.dist, run.device))  # all ranks' (a sync: here)
    if window.steps == 0:
        meter.skip_window()
        return None
    seconds = meter.close_window(tokens, run.device)
    step_time = seconds / window.steps
    tok_s = tokens / seconds
    metrics.update(
        {
            "train/step_time_s": step_time,
            "train/samples_per_sec": run.plan.effective_batch_size / step_time,
            "train/tokens_per_sec": tok_s,
            "train/mfu": _mfu(run, tok_s),
        }
    )
    metrics.update(_step_timing(meter, window.steps))
    return tok_s


def _step_timing(meter: Throughput, steps: int) -> dict[str, float]:
    """Device-side step time (CUDA events) and the slowest step, when the loop marks steps."""
    out = {}
    if meter.device_seconds is not None:
        out["train/device_step_time_s"] = meter.device_seconds / steps
    if meter.step_times:
        out["train/step_time_max_s"] = max(meter.step_times)
    return out


def _mfu(run: Run, tokens_per_sec: float) -> float | None:
    facts = run.facts
    if facts.flops_per_token is None:
        return None
    return mfu(tokens_per_sec / run.dist.world_size, facts.flops_per_token, facts.peak_tflops)


def _eval_and_report(run: Run, step: int, summary: dict[str, Any]) -> dict[str, float]:
    started = time.perf_counter()
    values = evaluate_metrics(run, step)
    if empties_cache_after_eval(run.cfg, run.device):
        torch.cuda.empty_cache()
    # Short HPO trials are easily dominated by evaluation: what it cost is in the summary.
    summary["eval_time_s"] = summary.get("eval_time_s", 0.0) + time.perf_counter() - started
    summary["evaluations"] = summary.get("evaluations", 0) + 1
    if not math.isfinite(values["loss"]):
        raise Diverged(f"validation loss is {values['loss']} at step {step}")
    summary.update({f"final_val_{m.name}": values[m.name] for m in run.task.metrics})
    metrics = {f"val/{name}": value for name, value in values.items()}
    run.history.append({"step": step, **metrics})
    if run.observers.logger is not None:
        run.observers.logger.log(step, metrics)
    reported = {f"val_{m.name}": values[m.name] for m in run.task.metrics}
    reported.update({f"final_{k}": v for k, v in reported.items()})
    # The last evaluation is the trial's result: it is reported, never pruned.
    if run.observers.reporter.report(step, reported) and step < run.cfg.max_steps:
        shown = ", ".join(f"{k} {v:.4f}" for k, v in reported.items() if not k.startswith("final"))
        raise Pruned(f"pruned at step {step} with validation {shown.replace('val_', '')}")
    return values


def empties_cache_after_eval(cfg: DictConfig, device: torch.device) -> bool:
    """training.empty_cache_after_eval on a CUDA device: the evaluation's cached blocks go back
    to the driver (for another process on the card, or fragmentation after eval's own shapes)."""
    return bool(cfg.empty_cache_after_eval) and device.type == "cuda"


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
