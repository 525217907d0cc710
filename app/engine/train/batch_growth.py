"""training.batch_schedule=adaptive in the loop: the effective batch doubles as the gradient noise
scale grows (the rule and what a run holds of it: app/engine/batch_schedule.py).

The rule is read at log points, where the run already syncs with the host; rank 0 decides and
every rank hears its decision (one small broadcast), so all change at the same step. A doubling
takes effect from the next optimizer step: the budget's phases (the data seen stays exact, the
steps to the budget follow), the plan (the micro-batch grows up to the largest the probe found
fits, with training.micro_batch_size=auto, and the accumulation makes up the rest; a micro-batch
set by hand is kept), the noise scale's batch, the learning rate (lr_scaling at the new batch,
on the same data schedule) and the data loader, which restarts at that step on the same stream
of samples.
"""

from __future__ import annotations

from app.components.schedule import LrSchedule
from app.config.budget import TrainBudget
from app.config.phases import BatchPhases
from app.config.training import TrainingConfig
from app.core.errors import ConfigError
from app.engine.batch_schedule import BatchGrowth, BatchRamp, RampRule, StepsFrom
from app.engine.comms.distributed import rank0_word
from app.engine.run import Run


def build_growth(
    t: TrainingConfig, schedule: LrSchedule, steps_from: StepsFrom
) -> BatchGrowth | None:
    """The adaptive schedule of a run with these settings (None: a fixed batch). Its patience
    is written in steps of training.reference_batch, as the data budget's counts are."""
    if t.batch_schedule != "adaptive":
        return None
    a = t.adaptive_batch
    patience = a.patience_steps * t.reference_batch
    rule = RampRule(a.noise_fraction, patience, t.batch_cap, a.smoothing)
    return BatchGrowth(BatchRamp(rule), schedule, steps_from)


def grow_at_log_point(run: Run, done: int) -> None:
    """At a log point before the last step: read the noise scale, ask the rule (rank 0), and
    change the batch from step `done` on where it says so."""
    growth, budget = run.growth, run.budget
    if growth is None or done >= budget.max_steps or not budget.logs(done):
        return
    new = 0
    if run.dist.is_main:
        noise = run.noise.value() if run.noise is not None else None  # synced at the log point
        new = growth.ramp.observe(noise, budget.samples_seen(done), budget.batch_at(done)) or 0
    new = rank0_word([new], run.dist)[0]
    if new:
        change_batch(run, done, new)


def change_batch(run: Run, step: int, batch: int) -> None:
    """Train at `batch` from optimizer step `step` on."""
    growth = run.growth
    assert growth is not None
    old_batch, old_lr = run.budget.batch_at(step), current_lr(run)
    run.budget = run.budget.with_batch_from(step, batch)
    run.plan = run.plan.at_batch(batch, two_per_step=run.noise is not None)
    if run.noise is not None:
        run.noise.big = batch
    growth.schedule.settings = run.budget
    set_lr(run, step)
    run.steps = growth.steps_from(step, run.budget)
    line = (
        f"batch      {old_batch} -> {batch} from step {step} "
        f"({run.budget.samples_seen(step):,} samples seen): {run.plan.describe()}; "
        f"lr {old_lr:.4g} -> {current_lr(run):.4g}; {run.budget.max_steps} steps to the budget"
    )
    growth.changes.append(line)
    if run.dist.is_main:
        print(line, flush=True)
        if run.observers.logger is not None:
            run.observers.logger.log(step, change_metrics(run, step, old_batch))
            run.observers.logger.text("run/batch_schedule", "\n\n".join(growth.changes))


def change_metrics(run: Run, step: int, old_batch: int) -> dict[str, float | None]:
    """The change as one record of the run's metrics (metrics.jsonl's event line), under its
    own names: the log point of the same step reports the batch its window trained at."""
    return {
        "batch/changed_from": float(old_batch),
        "batch/effective_batch_size": float(run.budget.batch_at(step)),
        "batch/learning_rate": current_lr(run),
        "batch/grad_accum_steps": float(run.plan.grad_accum_steps),
        **run.budget.data_seen(step),
    }


def current_lr(run: Run) -> float:
    """The rate the next optimizer step takes (the first parameter group's)."""
    return float(run.optimizer.param_groups[0]["lr"])


def set_lr(run: Run, step: int) -> None:
    """Step `step`'s rate under the new settings: the scheduler set it for the old batch."""
    growth = run.growth
    assert growth is not None
    factor = growth.schedule.multiplier(step)
    for group, base in zip(run.optimizer.param_groups, run.scheduler.base_lrs, strict=True):
        group["lr"] = base * factor


def resumed_budget(budget: TrainBudget, state: dict[str, object], t: TrainingConfig) -> TrainBudget:
    """The budget a checkpoint's phases give (its batch changed on the way); a fixed batch where
    it has none. A schedule that changed the batch resumes only as adaptive."""
    if not state:
        return budget
    phases = BatchPhases.from_json(state["phases"])  # type: ignore[arg-type]
    if len(phases.phases) > 1 and t.batch_schedule != "adaptive":
        raise ConfigError(
            f"training.resume: the checkpoint's batch grew ({phases.first.batch} -> "
            f"{phases.last.batch}) under training.batch_schedule=adaptive, this run has fixed; "
            "resume with training.batch_schedule=adaptive"
        )
    return budget.with_phases(phases)
