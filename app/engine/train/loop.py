"""The training loop: plain settings in, a summary out. No Hydra, no Optuna.

It reads top to bottom: for each optimizer step, a batch, a step (redone smaller after an OOM),
a log point, an evaluation, a checkpoint, a look at the stop flag. Host-device syncs happen
only at log, eval and checkpoint points: losses and grad norms stay on the device between them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from app.core.outcomes import Paused, Preempted
from app.engine.comms.distributed import any_rank
from app.engine.records.profiling import StepProfiler
from app.engine.records.summary import Summary
from app.engine.run import Run, Samples
from app.engine.saving.state import save
from app.engine.train.batch_growth import grow_at_log_point
from app.engine.train.evaluation import eval_and_report
from app.engine.train.metering import ProgressBar, Throughput, Window, log_window
from app.engine.train.recovery import step_with_recovery
from app.engine.train.step import StepResult


def train(run: Run, summary: Summary | None = None) -> Summary:
    """Run to the budget's last step (logs, evaluations, checkpoints where it places them);
    return the summary, which holds the progress of a run ended early by an outcome."""
    cfg = run.cfg
    summary = Summary() if summary is None else summary
    start_summary(run, summary)
    if run.start_step == 0 and cfg.eval_at_start:
        values = eval_and_report(run, 0, summary)
        summary.initial_val = {m.name: values[m.name] for m in run.task.metrics}
    meter = Throughput(run.device)
    window = Window(torch.zeros((), device=run.device))
    profiler = StepProfiler(
        run.budget.profiler,
        run.run_dir,
        run.device,
        run.budget.max_steps,
        run.dist.rank,
        resumed_at=run.start_step,
    )
    bar = _progress(run)
    tally = Tally(window, meter, summary, bar)
    step = run.start_step
    try:
        # The budget is read again at every step: an adaptive batch changes its steps.
        while step < run.budget.max_steps:
            batch = next(run.steps)
            run.observers.hooks.on_step_start(run, step, batch)
            if profiler.covers(step):
                window.add(profiled_step(run, batch, step, meter, profiler), counted=False)
                summary.profile = profiler.describe()
            else:
                window.add(step_with_recovery(run, batch, step))
                meter.mark_step()  # a CUDA event (no sync) or a clock reading, read at log points
            run.observers.hooks.on_step_end(run, step)
            step += 1
            after_step(run, step, tally)
    finally:
        # Once, however the run ends (only a closed window changes them; nothing reads them
        # while it runs): a pass over every window at each log point would grow with the run.
        summary.tokens_per_sec = meter.steady_tokens_per_sec()
        summary.train_time_s = meter.training_seconds()
        profiler.close()  # a run that ends inside the window still writes its trace
        if bar is not None:
            bar.close()
    return summary


@dataclass
class Tally:
    """What the loop keeps across steps: the open log window, the clock, the summary, the bar."""

    window: Window
    meter: Throughput
    summary: Summary
    bar: ProgressBar | None


def after_step(run: Run, done: int, tally: Tally) -> None:
    """A step's log point, batch change, progress, evaluation, checkpoint and stop check, in
    that order: a batch that changes from the next step is in the checkpoint of this one."""
    budget, meter, summary, bar = run.budget, tally.meter, tally.summary, tally.bar
    if budget.logs(done):
        log_window(run, done, tally.window, meter, summary, bar)
        grow_at_log_point(run, done)
        if bar is not None and run.budget is not budget:
            bar.total = run.budget.max_steps
    record_progress(run, done, summary)  # before the evaluation: a pruned trial did it
    if run.budget.evaluates(done):
        with meter.pause():
            evaluate_or_pause(run, done, summary)
    saved = run.budget.checkpoints(done)
    if saved:
        with meter.pause():
            save(run, done)
    if bar is not None:
        bar.update(1)
    if done < run.budget.max_steps and stop_requested(run):
        stop_here(run, done, saved)


def start_summary(run: Run, summary: Summary) -> None:
    """Every metric's initial and final value unknown, no step done, no window closed."""
    summary.initial_val = {m.name: None for m in run.task.metrics}
    summary.final_val = {m.name: None for m in run.task.metrics}
    record_progress(run, run.start_step, summary)
    summary.tokens_per_sec, summary.train_time_s = None, 0.0


def evaluate_or_pause(run: Run, done: int, summary: Summary) -> None:
    """Evaluate and report; a trial its pruner pauses at this rung keeps a checkpoint of this
    step, which its promotion resumes from exactly. Every rank hears the pause at this step
    (eval_and_report) and saves its part: rank 0 the whole file (DDP), or each its shards
    (FSDP)."""
    try:
        eval_and_report(run, done, summary)
    except Paused:
        save(run, done)
        raise


def record_progress(run: Run, done: int, summary: Summary) -> None:
    """The steps done and the data seen, all ranks together: samples, and tokens where every
    sample is a block of one length."""
    summary.steps = done
    summary.samples_seen = run.budget.samples_seen(done)
    summary.tokens_seen = run.budget.tokens_seen(done)


def profiled_step(
    run: Run, batch: Samples, step: int, meter: Throughput, profiler: StepProfiler
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
        f"{signal}: stopped after step {done} of {run.budget.max_steps} with a checkpoint; "
        "training.resume=auto (same run dir) or training.resume=<run dir> continues exactly",
        signum=stop.signum or 15,
        step=done,
    )


def _progress(run: Run) -> ProgressBar | None:
    if not (run.cfg.progress_bar and run.dist.is_main):
        return None
    from tqdm.auto import tqdm

    return tqdm(
        total=run.budget.max_steps,
        initial=run.start_step,
        desc="train",
        unit="step",
        dynamic_ncols=True,
        mininterval=1.0,
    )
