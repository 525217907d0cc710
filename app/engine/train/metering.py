"""Throughput and the figures of a log window: tokens/s excluding evaluation and checkpoints,
device step time from CUDA events, MFU, memory; read at log points only, where the loop syncs
once for the loss anyway."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import torch

from app.core.outcomes import Diverged
from app.engine.comms.distributed import global_sum
from app.engine.records.summary import Summary
from app.engine.records.telemetry import cuda_memory_metrics, mfu, peak_memory_bytes
from app.engine.run import Run
from app.engine.train.step import StepResult

# Where a step ended: a CUDA event recorded on the stream, or (CPU) the host clock's seconds.
Mark = torch.cuda.Event | float


class ProgressBar(Protocol):
    """The progress bar a loop on the main rank draws (tqdm's)."""

    total: float | None  # the steps to the budget, which an adaptive batch changes

    def update(self, n: int = 1) -> object: ...

    def set_postfix(self, ordered_dict: dict[str, str], refresh: bool = True) -> None: ...

    def close(self) -> None: ...


class Throughput:
    """Tokens/s over log windows, excluding eval and checkpoint time.

    Wall time is read only at log points, just after the window's one host sync (the loss
    `.item()`), so it is exact without a per-step synchronize. Step timing uses marks: a CUDA
    event recorded on the stream (no sync) or, on CPU, a host clock reading, taken by
    `mark_step()` after each step and at window edges. Their elapsed times are read only in
    `close_window()`, when the events have completed, so reading them never waits either.
    """

    def __init__(
        self, device: torch.device | None = None, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.clock = clock  # the host's seconds (a test gives its own)
        self.window_start = clock()
        self.paused = 0.0
        self.windows: list[tuple[int, float]] = []  # (tokens, seconds)
        self.device = device
        # ("origin" | "step" | "end", mark): a step is timed from the mark before it.
        self._marks: list[tuple[str, Mark]] = [] if device is None else [("origin", self._mark())]
        self.step_times: list[float] = []  # of the last closed window, when steps were marked
        self.device_seconds: float | None = None  # of the last closed window

    def _mark(self) -> Mark:
        if self.device is not None and self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return self.clock()

    def mark_step(self) -> None:
        if self.device is not None:
            self._marks.append(("step", self._mark()))

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        t0 = self.clock()
        yield
        self.paused += self.clock() - t0
        if self._marks:  # the next step is timed from here, not across the eval
            self._marks.append(("origin", self._mark()))

    def close_window(self, tokens: int, device: torch.device | None = None) -> float:
        """Close the window (call after a host sync); returns its wall seconds."""
        now = self.clock()
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
        self.window_start, self.paused = self.clock(), 0.0
        if self.device is not None:
            self._marks = [("origin", self._mark())]

    def _read_marks(self) -> None:
        self.step_times, self.device_seconds = [], None
        if self.device is None:
            return
        end = self._mark()
        self._marks.append(("end", end))
        if isinstance(end, torch.cuda.Event):
            end.synchronize()  # already done: the caller synced for the loss
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


def _elapsed(start: Mark, end: Mark) -> float:
    if isinstance(start, float) and isinstance(end, float):
        return end - start
    if isinstance(start, torch.cuda.Event) and isinstance(end, torch.cuda.Event):
        return start.elapsed_time(end) / 1000.0  # CUDA events: milliseconds
    raise TypeError("a step timed between a CUDA event and a clock reading")


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


def log_window(
    run: Run,
    done: int,
    window: Window,
    meter: Throughput,
    summary: Summary,
    bar: ProgressBar | None,
) -> None:
    """The window's figures to the logs and the progress bar (the window's one host sync)."""
    assert window.grad_norm is not None  # a log point follows at least one step
    train_loss = window.loss.item() / max(window.units, 1)  # the window's host sync
    if not math.isfinite(train_loss):
        raise Diverged(f"train loss is {train_loss} at step {done}")
    metrics: dict[str, float | None] = {
        "train/loss": train_loss,
        # the rate the next step takes: the scheduler's, or a batch change's since
        "train/learning_rate": float(run.optimizer.param_groups[0]["lr"]),
        "train/effective_batch_size": float(run.budget.batch_at(done - 1)),
        "train/grad_norm": float(window.grad_norm),
        "train/micro_batch_size": float(run.plan.micro_batch_size),
        "train/grad_accum_steps": float(run.plan.grad_accum_steps),
    }
    metrics.update(run.budget.data_seen(done))
    if run.noise is not None:  # the host sync is the window's own, just above
        summary.noise_scale = run.noise.value()
        metrics["train/noise_scale"] = summary.noise_scale
    tok_s = throughput_figures(run, window, meter, metrics)
    if run.device.type == "cuda":
        metrics.update(cuda_memory_metrics(run.device))
    else:
        metrics["system/peak_rss_mb"] = peak_memory_bytes(run.device) / 2**20
    summary.final_train_loss = train_loss
    if run.observers.logger is not None:
        run.observers.logger.log(done, metrics)
    if bar is not None:
        postfix = {"loss": f"{train_loss:.4f}"}
        if tok_s is not None:
            postfix["tok_s"] = f"{tok_s:,.0f}"
        bar.set_postfix(postfix, refresh=False)
    window.reset()


def throughput_figures(
    run: Run, window: Window, meter: Throughput, metrics: dict[str, float | None]
) -> float | None:
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
