"""What a run tells: the plan it prints once at start, what summary.json records, and the line it
ends with."""

from __future__ import annotations

import logging
import math
from pathlib import Path

from app.components.models.families import mup_rules
from app.components.models.mup import base_head_dim, widths
from app.components.optim import OPTIMIZERS
from app.components.tracking import tracked_config
from app.config.budget import BudgetUnit
from app.config.schema import TrainConfig
from app.engine.batch.probe import describe as describe_choice
from app.engine.batch.probe import plan_scalars
from app.engine.batch_plan import BatchPlan
from app.engine.parallel.rank_memory import expected_state_bytes, memory_line, whole_model_bytes
from app.engine.records.summary import Summary
from app.engine.records.telemetry import mfu, peak_memory_bytes, write_json_atomic
from app.engine.run import Machine, Run
from app.hpo import TrialAttrs

log = logging.getLogger(__name__)


def describe_run(summary: Summary, run: Run, machine: Machine, config: TrainConfig) -> None:
    """The plan, as summary.json records it."""
    device, precision = machine.device, machine.precision
    seq_len = run.task.sequence_length(config.data)
    record_plan(summary, run.plan)
    summary.task = run.task.name
    summary.device, summary.device_name, summary.preset = device.type, device.name, device.preset
    summary.device_memory_bytes = device.total_memory_bytes
    summary.memory_limit_bytes = device.memory_limit_bytes
    summary.dtype, summary.precision_reason = precision.name, precision.reason
    summary.world_size = run.dist.world_size
    summary.parallelism = config.training.parallelism
    optimizer = OPTIMIZERS.get(config.training.optimizer)
    summary.model_state_bytes = expected_state_bytes(run.raw_model, optimizer.state_bytes_per_param)
    summary.seq_len = seq_len
    # Causal LM: exact. Padded tasks: the most a step can hold (sequences are shorter).
    summary.tokens_per_step = run.plan.effective_batch_size * seq_len
    summary.num_params = run.facts.num_params
    summary.flops_per_token = run.facts.flops_per_token
    summary.peak_tflops = run.facts.peak_tflops
    summary.resumed_from_step = run.start_step
    record_budget(summary, run, config)
    summary.warnings = machine.warnings
    summary.task_fields = run.task.summary_fields()


def record_budget(summary: Summary, run: Run, config: TrainConfig) -> None:
    b, t = run.budget, config.training
    summary.budget_setting, summary.budget, summary.budget_unit = b.setting, b.total, b.unit.value
    summary.max_steps, summary.warmup_steps = b.max_steps, b.warmup_steps
    summary.lr, summary.lr_scaling = b.lr, t.lr_scaling
    # The reference batch means something only where it scales the LR or the step counts
    uses_reference = t.lr_scaling != "none" or b.unit is not BudgetUnit.STEPS
    summary.lr_reference_batch = t.reference_batch if uses_reference else None


def lr_line(run: Run, config: TrainConfig) -> str:
    t, b = config.training, run.budget
    if t.lr_scaling == "none":
        return f"lr         {b.lr:g} ({t.schedule}, warm-up {b.warmup_steps:.3g} steps)"
    return (
        f"lr         {b.lr:.4g} = training.lr {t.lr:g} x {b.lr_factor:.4g} ({t.lr_scaling} of "
        f"batch {run.plan.effective_batch_size} / reference {t.reference_batch}; {t.schedule}, "
        f"warm-up {b.warmup_steps:.3g} steps)"
    )


def mup_line(config: TrainConfig) -> str | None:
    """What μP does at this width, once (None: the standard parametrization)."""
    m = config.model
    rules = mup_rules(m)
    if rules is None:
        return None
    w = widths(m, rules)
    head = base_head_dim(m)
    own = "=null, this model's head width" if m.mup.base_head_dim is None else f"={head}"
    optimizer = OPTIMIZERS.get(config.training.optimizer)
    rate = w.mult**optimizer.mup_exponent
    return (
        f"width {w.width} = {w.mult:g} x base {w.base} (model.mup.base_width): hidden matrices' "
        f"init std / {w.mult**0.5:.3g}, lr / {rate:.3g} and weight decay x {rate:.3g} "
        f"({optimizer.label}), logits x {m.mup.output_mult / w.mult:.3g}, attention scores x "
        f"{m.mup.attn_mult:g} x sqrt({head})/d_head (model.mup.base_head_dim{own}: the "
        f"standard scale at head width {head})"
    )


def record_plan(summary: Summary, plan: BatchPlan) -> None:
    summary.micro_batch_size = plan.micro_batch_size
    summary.micro_batch_sizes = plan.micro_sizes
    summary.grad_accum_steps = plan.grad_accum_steps
    summary.effective_batch_size = plan.effective_batch_size
    summary.eval_micro_batch_size = plan.eval_micro
    summary.batch_source = plan.source
    summary.batch_details = plan.details


def plan_fields(plan: BatchPlan) -> dict[str, object]:
    """The batch plan as trackers store it beside the config (summary.json's batch keys)."""
    return {
        "micro_batch_size": plan.micro_batch_size,
        "micro_batch_sizes": plan.micro_sizes,
        "grad_accum_steps": plan.grad_accum_steps,
        "effective_batch_size": plan.effective_batch_size,
        "eval_micro_batch_size": plan.eval_micro,
        "batch_source": plan.source,
        "batch_details": plan.details.to_json(),
    }


def print_banner(summary: Summary, run: Run, machine: Machine, config: TrainConfig) -> None:
    if not run.dist.is_main:
        return
    step = run.task.step_line(run.plan.effective_batch_size, summary.seq_len or 0)
    lines = [
        summary.device_line(),  # describe_run recorded the device and precision
        summary.precision_line(),
        f"batch      {run.plan.describe()}",
        *([f"autobatch  {how}"] if (how := describe_choice(run.plan)) else []),
        *([f"schedule   {run.growth.describe(run.budget)}"] if run.growth is not None else []),
        f"{step}, {summary.num_params:,} parameters",
        memory_line(summary.model_state_bytes, whole_model_bytes(run.raw_model), run.dist),
        f"budget     {run.budget.describe()}",
        lr_line(run, config),
        *([f"mup        {how}"] if (how := mup_line(config)) else []),
        eval_line(run),
        f"steps      {run.start_step} -> {run.budget.max_steps}; run dir {run.run_dir}",
    ]
    lines += [f"warning    {w}" for w in machine.warnings]
    print("\n".join(lines), flush=True)
    logger = run.observers.logger
    if logger is not None:
        logger.config(tracked_config(config), plan_fields(run.plan))
        logger.text("run/plan", "\n\n".join(lines))
        logger.log(run.start_step, plan_scalars(run.plan))


def eval_line(run: Run) -> str:
    t, b = run.cfg, run.budget
    count = b.evaluations_after(run.start_step)
    count += int(run.start_step == 0 and t.eval_at_start)
    return (
        f"eval       {len(run.val_blocks):,} samples x {count} evaluations (every "
        f"{b.eval_every:,} {b.unit}), micro-batch {run.plan.eval_micro}, no gradients"
    )


def closing_line(summary: Summary) -> str:
    def num(value: float | None, spec: str) -> str:
        return "n/a" if value is None else format(value, spec)

    loss = "loss"
    peaks = summary.peak_memory_bytes_per_rank or []
    per_rank = (
        f"peak memory per rank {', '.join(f'{p / 2**20:,.0f}' for p in peaks)} MiB, "
        if len(peaks) > 1
        else ""
    )
    return (
        f"done       {summary.status} after {summary.steps} steps: val loss "
        f"{num(summary.initial_val.get(loss), '.4f')} -> "
        f"{num(summary.final_val.get(loss), '.4f')}, "
        f"{num(summary.tokens_per_sec, ',.0f')} tokens/s, "
        f"{num(summary.eval_time_s, '.1f')} s evaluating, {per_rank}"
        f"summary {summary.run_dir}/summary.json"
    )


def write_summary(run_dir: Path, summary: Summary) -> None:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(run_dir / "summary.json", summary.to_json())
    except OSError as exc:  # a full disk must not hide how the run ended
        log.error("could not write %s/summary.json: %s", run_dir, exc)


def summarize_run(run: Run, summary: Summary) -> None:
    """The figures known once the run has ended: the final plan, peak memory, OOMs, MFU."""
    record_plan(summary, run.plan)
    if run.growth is not None:
        summary.batch_schedule = run.budget.batch_phases.to_json()
        summary.max_steps = run.budget.max_steps  # the steps the batches it reached took
    summary.peak_memory_bytes = peak_memory_bytes(run.device)
    if run.device.type == "cuda" and summary.device_memory_bytes:
        summary.peak_memory_fraction = summary.peak_memory_bytes / summary.device_memory_bytes
    summary.oom_count = run.plan.ooms.count
    summary.probe_samples_per_sec = probed_samples_per_sec(summary)
    busy = summary.train_time_s + (summary.eval_time_s or 0.0)
    summary.device_seconds = busy * run.dist.world_size
    facts = run.facts
    if summary.tokens_per_sec and facts.flops_per_token and facts.peak_tflops:
        per_device = summary.tokens_per_sec / run.dist.world_size
        summary.mfu = mfu(per_device, facts.flops_per_token, facts.peak_tflops)


def probed_samples_per_sec(summary: Summary) -> float | None:
    """The fastest micro-batch the probe found fitting within a rank's share of the effective
    batch, times the ranks: the device's throughput at this batch, whatever micro-batch the run
    itself used (training.noise_scale halves it)."""
    probe = summary.batch_details.probe
    if probe is None:
        return None
    share = math.ceil((summary.effective_batch_size or 0) / max(summary.world_size, 1))
    fastest = probe.fastest_fitting(share)
    return None if fastest is None else fastest * summary.world_size


def trial_attrs(summary: Summary) -> TrialAttrs:
    """What the run attaches to its trial (app.hpo.TrialAttrs), from its summary."""
    return TrialAttrs(
        micro_batch_size=summary.micro_batch_size,
        grad_accum_steps=summary.grad_accum_steps,
        batch_source=summary.batch_source,
        effective_batch_size=summary.effective_batch_size,
        lr=summary.lr,
        samples_seen=summary.samples_seen,
        noise_scale=summary.noise_scale,
        batch_schedule=summary.batch_schedule,
        probe_samples_per_sec=summary.probe_samples_per_sec,
        peak_memory_bytes=summary.largest_peak_bytes,
        tokens_per_sec=summary.tokens_per_sec,
        device_seconds=summary.device_seconds,
        run_dir=summary.run_dir,
        status=summary.status,
    )
