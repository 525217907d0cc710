"""One training run, in the order of the design: hardware, precision, resume, data, model, batch
plan, loop, summary. Called by the Hydra entrypoint with the composed config and the run dir."""

from __future__ import annotations

import gc
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from app.engine import checkpoint as ckpt
from app.cli import run_dir_guard
from app.engine.batch.faults import FaultInjector
from app.engine.batch.plan import BatchPlan, eval_micro_size, fixed_plan
from app.engine.batch.probe import auto_plan, oom_listener, plan_scalars
from app.engine.batch.probe import describe as describe_choice
from app.engine.start_checks import AlreadyComplete, check_start, tokenizer_warning
from app.config.schema import ConfigError, validate
from app.engine.context import RunContext
from app.components.data.loader import StepDataset, make_step_loader, resolve_num_workers
from app.engine.distributed import DistInfo, init_distributed, shared_run_dir, shutdown, wrap_ddp
from app.cli.export import export_run, save_run_tokenizer
from app.components.hardware.cuda_alloc import apply_expandable_segments
from app.components.hardware.devices import detect_device, effective_preset
from app.components.hardware.host_malloc import apply_host_malloc
from app.components.hardware.precision import apply_precision_flags, resolve_precision
from app.engine.loop import (
    ModelFacts,
    Observers,
    Run,
    evaluations_after,
    peak_memory,
    restore,
    train,
)
from app.components.models.build import maybe_compile, model_shape
from app.hpo import build_reporter
from app.components.optim.adamw import build_optimizer, build_scheduler
from app.core.outcomes import RunOutcome
from app.core.preemption import stop_on_signals
from app.components.tasks import Task, TaskData, build_task
from app.engine.telemetry import RunLogger, flops_per_token, mfu, write_json_atomic
from app.components.tracking import build_sinks, tracked_config

log = logging.getLogger(__name__)


def run_training(cfg: DictConfig, run_dir: str | Path) -> dict[str, Any]:
    """Train as configured; write summary.json; return the summary. Raises RunOutcome on
    pruning, divergence, an unrecoverable OOM or preemption (after writing the summary), and
    ConfigError for a setting it cannot honour (before writing anything)."""
    started = time.perf_counter()
    run_dir = Path(run_dir)
    validate(cfg)
    apply_host_malloc(cfg.training.host_malloc)  # before the data and model allocate
    apply_expandable_segments(cfg.training.expandable_segments)  # before CUDA starts
    device = detect_device(cfg.gpu)
    dist = init_distributed(device.type)
    run_dir = shared_run_dir(run_dir, dist)
    try:
        resume_from = check_start(cfg, run_dir, device.type, device.total_memory_bytes)
    except AlreadyComplete as done:
        return already_complete(done, run_dir, cfg, dist)
    preset = effective_preset(cfg.gpu, device)
    precision = resolve_precision(cfg.precision.name, device, preset)
    ctx = RunContext(cfg, device, preset, precision, dist, build_task(cfg.get("task")))
    ctx.warnings = [*device.warnings, *filter(None, [tokenizer_warning(cfg)])]
    state = ckpt.load_checkpoint(resume_from) if resume_from else None  # fail before work
    apply_precision_flags(precision)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.cuda.reset_peak_memory_stats(device.torch_device)
    torch.manual_seed(cfg.training.seed)

    observers = Observers(reporter=build_reporter(cfg))
    summary: dict[str, Any] = {"status": "running", "run_dir": str(run_dir)}
    run = None
    try:
        with stop_on_signals(observers.stop):
            run = build_run(ctx, run_dir, state, observers)
            summary.update(describe_run(run, ctx))
            print_banner(summary, ctx, run)
            run_dir_guard.disarm()  # from here on, what the run writes is its own
            train(run, summary)
            if cfg.training.export and dist.is_main:
                summary["export_dir"] = str(
                    export_run(run.raw_model, ctx.task, cfg.data, run_dir)  # plain weights
                )
        summary["status"] = "completed"
    except ConfigError:
        summary["status"] = "not_started"  # a setting: nothing ran, nothing is written
        raise
    except RunOutcome as exc:
        summary.update(status=exc.status, error=str(exc))
        raise
    except BaseException as exc:
        summary.update(status="failed", error=f"{type(exc).__name__}: {exc}")
        raise
    finally:
        finish(run, summary, started, dist, observers.reporter)
    return summary


def already_complete(done: AlreadyComplete, run_dir: Path, cfg: DictConfig, dist) -> dict:
    """Resuming a finished run: say so, write nothing (Hydra's rewrite of .hydra/ undone),
    return what the run left."""
    run_dir_guard.restore_after_refusal()
    if dist.is_main:
        print(f"done       {done}", flush=True)
    shutdown(dist)
    found = ckpt.find_resume_checkpoint(cfg.training.resume, run_dir)
    saved = found.parent.parent / "summary.json" if found else None
    if saved is not None and saved.is_file():
        return json.loads(saved.read_text())
    return {"status": "completed", "run_dir": str(run_dir)}


def build_run(
    ctx: RunContext, run_dir: Path, state: dict[str, Any] | None, observers: Observers
) -> Run:
    cfg, device, dist = ctx.cfg, ctx.device, ctx.dist
    data = ctx.task.load_data(cfg.data)
    tdev = device.torch_device
    model = ctx.task.build_model(cfg.model, data).to(tdev)
    plan = choose_plan(ctx, model, data)
    optimizer = build_optimizer(model, cfg.training)
    start_step = int(state["step"]) if state is not None else 0
    if cfg.training.micro_batch_size == "auto" and dist.is_main:
        observers.on_plan_change = oom_listener(ctx, model)
    run = Run(
        model=wrap_ddp(maybe_compile(model, cfg.model, ctx.preset), dist, tdev),
        raw_model=model,
        optimizer=optimizer,
        scheduler=build_scheduler(optimizer, cfg.training),
        plan=plan,
        precision=ctx.precision,
        device=tdev,
        cfg=cfg.training,
        steps=iter(step_loader(ctx, data, plan, start_step)),
        val_blocks=data.val[: cfg.training.eval_samples],
        run_dir=run_dir,
        task=ctx.task,
        scaler=torch.amp.GradScaler(device.type) if ctx.precision.use_grad_scaler else None,
        faults=FaultInjector(cfg.faults, dist.rank),
        dist=dist,
        start_step=start_step,
        observers=observers,
        facts=model_facts(ctx, model),
    )
    if state is not None:
        try:
            restore(run, state)
        except (RuntimeError, KeyError, ValueError) as exc:  # another model's checkpoint
            raise ConfigError(
                f"training.resume: the checkpoint does not fit this model ({_first_line(exc)}); "
                "resume with the model it was trained with"
            ) from None
    if dist.is_main:  # last: a run refused above has written nothing
        run_dir.mkdir(parents=True, exist_ok=True)
        nvml = device.index if device.type == "cuda" else None
        observers.logger = RunLogger(run_dir, nvml_index=nvml, sinks=build_sinks(cfg, run_dir))
        # Saved now, from the data the run trains on: an export needs no data later. After the
        # trackers, the last refusal: a refused start never replaces a finished run's tokenizer.
        run.facts.tokenizer = save_run_tokenizer(ctx.task.export_tokenizer(cfg.data), run_dir)
    return run


def model_facts(ctx: RunContext, model: torch.nn.Module) -> ModelFacts:
    shape = model_shape(model)
    seq = ctx.task.sequence_length(ctx.cfg.data)
    return ModelFacts(
        num_params=shape.num_params,
        flops_per_token=flops_per_token(
            shape.num_params, shape.n_layer, shape.n_head, shape.head_dim, seq
        ),
        peak_tflops=ctx.device.peak_tflops.get(ctx.precision.name),
        identity=model_identity(ctx.cfg),
    )


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return " ".join(lines[:2])[:300] if lines else type(exc).__name__


def model_identity(cfg: DictConfig) -> dict[str, Any]:
    """The settings that shape the model, saved in each checkpoint (app/checks.py SHAPE_KEYS)."""
    return OmegaConf.to_container(
        OmegaConf.masked_copy(cfg, ["task", "model", "data"]), resolve=True, throw_on_missing=False
    )


def choose_plan(ctx: RunContext, model: torch.nn.Module, data: TaskData) -> BatchPlan:
    t, dist = ctx.cfg.training, ctx.dist
    if t.micro_batch_size == "auto":
        plan = auto_plan(ctx, model, data)
    else:
        plan = fixed_plan(t.effective_batch_size, t.micro_batch_size, dist.world_size, dist.rank)
    return plan.with_eval_micro_batch(eval_micro_batch(t, plan.micro_batch_size))


def eval_micro_batch(t: DictConfig, micro: int) -> int | None:
    """The evaluation micro-batch (eval_micro_size), never more than the validation samples."""
    size = eval_micro_size(t.eval_micro_batch_size, micro)
    return None if size is None else max(1, min(size, t.eval_samples))


def step_loader(ctx: RunContext, data: TaskData, plan: BatchPlan, start_step: int):
    cfg, dist, device = ctx.cfg, ctx.dist, ctx.device
    d = cfg.data
    dataset = StepDataset(
        data.train,
        plan.effective_batch_size,
        d.seed,
        rank=dist.rank,
        world_size=dist.world_size,
        lengths=data.train_lengths if d.length_grouping else None,
        group_steps=d.group_steps,
    )
    on_cuda = device.type == "cuda"
    return make_step_loader(
        dataset,
        start_step,
        cfg.training.max_steps - start_step,
        num_workers=resolve_num_workers(d.num_workers, ctx.preset.dataloader_workers),
        pin_memory=on_cuda if d.pin_memory is None else bool(d.pin_memory and on_cuda),
        persistent_workers=d.persistent_workers,
        prefetch_factor=d.prefetch_factor,
    )


def describe_run(run: Run, ctx: RunContext) -> dict[str, Any]:
    device, precision = ctx.device, ctx.precision
    seq_len = ctx.task.sequence_length(ctx.cfg.data)
    return {
        **batch_fields(run.plan),
        "task": ctx.task.name,
        "device": device.type,
        "device_name": device.name,
        "preset": device.preset,
        "device_memory_bytes": device.total_memory_bytes,
        "dtype": precision.name,
        "precision_reason": precision.reason,
        "world_size": run.dist.world_size,
        "seq_len": seq_len,
        # Causal LM: exact. Padded tasks: the most a step can hold (sequences are shorter).
        "tokens_per_step": run.plan.effective_batch_size * seq_len,
        "num_params": run.facts.num_params,
        "flops_per_token": run.facts.flops_per_token,
        "peak_tflops": run.facts.peak_tflops,
        "resumed_from_step": run.start_step,
        "warnings": ctx.warnings,
        **ctx.task.summary_fields(),
    }


def batch_fields(plan: BatchPlan) -> dict[str, Any]:
    return {
        "micro_batch_size": plan.micro_batch_size,
        "micro_batch_sizes": plan.micro_sizes,
        "grad_accum_steps": plan.grad_accum_steps,
        "effective_batch_size": plan.effective_batch_size,
        "eval_micro_batch_size": plan.eval_micro,
        "batch_source": plan.source,
        "batch_details": plan.details,
    }


def print_banner(summary, ctx: RunContext, run: Run) -> None:
    if not ctx.dist.is_main:
        return
    device, precision = ctx.device, ctx.precision
    mem = f", {device.total_memory_bytes / 2**30:.1f} GiB" if device.total_memory_bytes else ""
    lines = [
        f"device     {device.type}: {device.name}{mem} (preset {device.preset})",
        f"precision  {precision.name}: {precision.reason}",
        f"batch      {run.plan.describe()}",
        *([f"autobatch  {how}"] if (how := describe_choice(run.plan)) else []),
        f"{step_line(summary, ctx.task)}, {summary['num_params']:,} parameters",
        eval_line(run),
        f"steps      {run.start_step} -> {run.cfg.max_steps}; run dir {run.run_dir}",
    ]
    lines += [f"warning    {w}" for w in ctx.warnings]
    print("\n".join(lines), flush=True)
    logger = run.observers.logger
    if logger is not None:
        logger.config(tracked_config(ctx.cfg), batch_fields(run.plan))
        logger.text("run/plan", "\n\n".join(lines))
        logger.log(run.start_step, plan_scalars(run.plan))


def eval_line(run: Run) -> str:
    t = run.cfg
    count = evaluations_after(run.start_step, t.eval_every, t.max_steps)
    count += int(run.start_step == 0 and t.eval_at_start)
    return (
        f"eval       {len(run.val_blocks):,} samples x {count} evaluations (every "
        f"{t.eval_every} steps), micro-batch {run.plan.eval_micro}, no gradients"
    )


def step_line(summary: dict[str, Any], task: Task) -> str:
    if task.unit == "target token":
        return (
            f"tokens     {summary['tokens_per_step']:,} per optimizer step "
            f"(seq_len {summary['seq_len']})"
        )
    return (
        f"samples    {summary['effective_batch_size']:,} per optimizer step, loss averaged "
        f"over them (max_length {summary['seq_len']}, padded per micro-batch)"
    )


def closing_line(summary: dict[str, Any]) -> str:
    def num(key: str, spec: str) -> str:
        value = summary.get(key)
        return "n/a" if value is None else format(value, spec)

    return (
        f"done       {summary['status']} after {summary.get('steps', '?')} steps: val loss "
        f"{num('initial_val_loss', '.4f')} -> {num('final_val_loss', '.4f')}, "
        f"{num('tokens_per_sec', ',.0f')} tokens/s, {num('eval_time_s', '.1f')} s evaluating, "
        f"summary {summary['run_dir']}/summary.json"
    )


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(run_dir / "summary.json", summary)
    except OSError as exc:  # a full disk must not hide how the run ended
        log.error("could not write %s/summary.json: %s", run_dir, exc)


def summarize_run(run: Run, summary: dict[str, Any], dist: DistInfo) -> None:
    summary.update(batch_fields(run.plan))
    summary["peak_memory_bytes"] = peak_memory(run)
    if run.device.type == "cuda" and summary.get("device_memory_bytes"):
        summary["peak_memory_fraction"] = (
            summary["peak_memory_bytes"] / summary["device_memory_bytes"]
        )
    summary["oom_count"] = run.plan.details.get("oom_count", 0)
    facts = run.facts
    if summary.get("tokens_per_sec") and facts.flops_per_token and facts.peak_tflops:
        per_device = summary["tokens_per_sec"] / dist.world_size
        summary["mfu"] = mfu(per_device, facts.flops_per_token, facts.peak_tflops)


def finish(run: Run | None, summary, started, dist: DistInfo, reporter) -> None:
    if summary["status"] == "not_started":
        shutdown(dist)
        return
    try:
        if run is not None:
            summarize_run(run, summary, dist)
        summary["wall_time_s"] = time.perf_counter() - started
        if dist.is_main and summary.get("run_dir"):
            write_summary(Path(summary["run_dir"]), summary)
            if run is not None:
                print(closing_line(summary), flush=True)
    finally:
        if run is not None and run.observers.logger is not None:
            # Every way a run ends passes here: the trackers' runs end with its status.
            run.observers.logger.close(summary)
    reporter.set_attrs(
        {
            k: summary.get(k)
            for k in (
                "micro_batch_size",
                "grad_accum_steps",
                "effective_batch_size",
                "peak_memory_bytes",
                "tokens_per_sec",
                "run_dir",
                "status",
            )
        }
    )
    del run
    if torch.cuda.is_available():
        # Tensors held only by reference cycles (an OOM's traceback frames) go back to the
        # allocator now, not at the next automatic collection. A full collection walks every
        # object of torch and transformers (~0.15 s), so a CPU run leaves it to Python.
        gc.collect()
        torch.cuda.empty_cache()
    shutdown(dist)
