"""One training run, in the order of the design: hardware, precision, resume, data, model, batch
plan, loop, summary. Called by the Hydra entrypoint with the typed config and the run dir."""

from __future__ import annotations

import dataclasses
import gc
import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from app.components.hardware.cuda_alloc import apply_expandable_segments
from app.components.hardware.devices import DeviceInfo, detect_device, effective_preset
from app.components.hardware.host_malloc import apply_host_malloc
from app.components.hardware.precision import apply_precision_flags, resolve_precision
from app.components.models.compiling import compiles, graphs_compiled
from app.components.models.families import mup_hidden
from app.components.models.pretrained_dir import tokenizer_warning
from app.components.models.shape import model_shape
from app.components.optim import OPTIMIZERS
from app.components.schedule import LrSchedule, build_scheduler
from app.components.tasks import build_task
from app.components.tasks.base import Task, TaskData
from app.components.tracking.sinks import build_sinks
from app.config.budget import TrainBudget
from app.config.schema import TrainConfig
from app.core import run_dir_guard
from app.core.errors import ConfigError, first_line
from app.core.outcomes import RunOutcome, Status
from app.core.preemption import stop_on_signals
from app.engine.batch.cache import ProbeSetup
from app.engine.batch.probe import auto_plan, oom_listener
from app.engine.batch_plan import BatchPlan, eval_micro_size, fixed_plan
from app.engine.comms.agreement import Agreement
from app.engine.comms.distributed import DistInfo, init_distributed, shared_run_dir, shutdown
from app.engine.comms.peers import answering_peers, peer_timeout_s
from app.engine.faults import FaultInjector
from app.engine.parallel.fsdp import full_state_dict
from app.engine.parallel.rank_memory import record_ranks
from app.engine.parallel.wrap import agreement, compiled_forward, forward_model, place
from app.engine.records.noise_scale import SMOOTHING, NoiseScale, check_plan
from app.engine.records.summary import Summary
from app.engine.records.telemetry import RunLogger, flops_per_token
from app.engine.report import (
    closing_line,
    describe_run,
    print_banner,
    summarize_run,
    trial_attrs,
    write_summary,
)
from app.engine.run import Machine, ModelFacts, Observers, Run
from app.engine.saving import checkpoint as ckpt
from app.engine.saving.state import restore
from app.engine.start_checks import AlreadyComplete, check_start, model_identity
from app.engine.step_data import StepsFrom
from app.engine.train.batch_growth import build_growth, resumed_budget
from app.engine.train.loop import train
from app.hpo import build_reporter


def run_training(
    config: TrainConfig,
    run_dir: str | Path,
    observers: Observers | None = None,
    task: Task | None = None,
) -> Summary:
    """Train as configured; write summary.json; return the summary. Raises RunOutcome on
    pruning, divergence, an unrecoverable OOM or preemption (after writing the summary), and
    ConfigError for a setting it cannot honour (before writing anything). `observers`: where
    the run reports (default: the trial's reporter, if any); `task`: the task config.task
    names, built (default) or given (a test's recording one)."""
    started = time.perf_counter()
    t = config.training
    apply_host_malloc(t.host_malloc)  # before the data and model allocate
    apply_expandable_segments(t.expandable_segments)  # before CUDA starts
    device = detect_device(config.gpu)
    dist = init_distributed(device.type, t.parallelism, peer_timeout(config))
    run_dir = shared_run_dir(Path(run_dir), dist)
    try:
        resume_from = check_start(config, run_dir, device.type, device.total_memory_bytes)
    except AlreadyComplete as done:
        return already_complete(done, run_dir, config, dist.is_main, lambda: shutdown(dist))
    machine = resolve_machine(config, device, dist)
    state = ckpt.load_checkpoint(resume_from) if resume_from else None  # fail before work
    graphs = graphs_compiled() if compiles(config.model, machine.preset) else None
    prepare_torch(machine, t.seed)
    if observers is None:
        observers = Observers(reporter=build_reporter(config.hpo, config))
    summary = Summary(run_dir=str(run_dir))
    run = None
    try:
        with stop_on_signals(observers.stop), answering_peers(dist, lambda: where(run)):
            run = build_run(config, machine, run_dir, state, observers, task)
            train_and_export(run, summary, machine, config)
        summary.status = Status.COMPLETED.value
    except BaseException as exc:
        summary.status, summary.error = ended_by(exc)
        raise
    finally:
        if graphs is not None:
            summary.compiled_graphs = graphs_compiled() - graphs
        finish(run, summary, started, machine, observers)
    return summary


def peer_timeout(config: TrainConfig) -> float:
    in_trial = config.hpo is not None and config.hpo.trial_number is not None
    return peer_timeout_s(config.training.peer_timeout_s, in_trial)


def where(run: Run | None) -> Agreement | None:
    return None if run is None else run.agreement


def resolve_machine(config: TrainConfig, device: DeviceInfo, dist: DistInfo) -> Machine:
    """The preset that applies to the device, the precision resolved for it, the warnings."""
    preset = effective_preset(config.gpu, device)
    precision = resolve_precision(config.precision.name, device, preset)
    if dist.sharded:
        from app.engine.parallel.fsdp import check_precision

        check_precision(precision)
    warning = tokenizer_warning(config.model, config.data) if not _from_config(config) else None
    return Machine(device, preset, precision, dist, [*device.warnings, *filter(None, [warning])])


def prepare_torch(machine: Machine, seed: int) -> None:
    apply_precision_flags(machine.precision)
    if machine.device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.cuda.reset_peak_memory_stats(machine.torch_device)
    torch.manual_seed(seed)


def train_and_export(run: Run, summary: Summary, machine: Machine, config: TrainConfig) -> None:
    describe_run(summary, run, machine, config)
    print_banner(summary, run, machine, config)
    run_dir_guard.disarm()  # from here on, what the run writes is its own
    train(run, summary)
    record_ranks(run, summary)
    if not config.training.export:
        return
    # FSDP: every rank sends its shards; rank 0 writes the whole model.
    weights = full_state_dict(run.raw_model) if machine.dist.sharded else None
    if machine.dist.is_main:
        summary.export_dir = str(export(run, config, run.run_dir, weights))


def ended_by(exc: BaseException) -> tuple[str, str | None]:
    """(status, error) of a run that an exception ended."""
    if isinstance(exc, ConfigError):
        return Status.NOT_STARTED.value, None  # a setting: nothing ran, nothing is written
    if isinstance(exc, RunOutcome):
        return Status(exc.status).value, str(exc)
    return Status.FAILED.value, f"{type(exc).__name__}: {exc}"


def _from_config(config: TrainConfig) -> bool:
    from app.components.models.families import MODELS

    return not MODELS.get(config.model.arch).loads_checkpoint


def export(
    run: Run, config: TrainConfig, run_dir: Path, weights: Mapping[str, object] | None = None
) -> Path:
    from app.engine.export import export_run

    # Plain weights: the module inside DDP and torch.compile, or FSDP's gathered state.
    return export_run(run.raw_model, run.task, config.data, config.model, run_dir, weights)


def already_complete(
    done: AlreadyComplete,
    run_dir: Path,
    config: TrainConfig,
    is_main: bool,
    close: Callable[[], None],
) -> Summary:
    """Resuming a finished run: say so, write nothing (Hydra's rewrite of .hydra/ undone),
    return what the run left."""
    run_dir_guard.restore_after_refusal()
    if is_main:
        print(f"done       {done}", flush=True)
    close()
    found = ckpt.find_resume_checkpoint(config.training.resume_from, run_dir)
    saved = found.parent.parent / "summary.json" if found else None
    if saved is not None and saved.is_file():
        return Summary.from_json(json.loads(saved.read_text()))
    return Summary(status=Status.COMPLETED.value, run_dir=str(run_dir))


def build_run(
    config: TrainConfig,
    machine: Machine,
    run_dir: Path,
    state: ckpt.TrainState | None,
    observers: Observers,
    task: Task | None = None,
) -> Run:
    task = build_task(config.task) if task is None else task
    data = task.load_data(config.data)
    tdev, dist = machine.torch_device, machine.dist
    whole = task.build_model(config.model, data)
    facts = model_facts(config, machine, task, whole)  # of the whole model (MFU), unsharded
    model = place(whole, config, machine)
    compiled = compiled_forward(model, config.model, machine)  # the probe's graphs are the run's
    setup = probe_setup(config, machine, task, config.budget())
    plan = choose_plan(setup, model, data, compiled)
    optimizer = build_optimizer(config, model, setup.budget)
    budget, plan, start_step = at_resume(config, state, setup.budget, plan)
    lr_schedule, steps_from = LrSchedule(budget), StepsFrom(config, machine, data)
    if config.training.fixed_micro_batch is None and dist.is_main:
        observers.on_plan_change = oom_listener(setup, model)
    run = Run(
        model=forward_model(compiled, machine),
        raw_model=model,
        optimizer=optimizer,
        scheduler=build_scheduler(optimizer, budget, lr_schedule),
        plan=plan,
        precision=machine.precision,
        device=tdev,
        cfg=config.training,
        steps=steps_from(start_step, budget),
        val_blocks=data.val[: config.training.eval_samples],
        run_dir=run_dir,
        task=task,
        budget=budget,
        scaler=torch.amp.GradScaler(tdev.type) if machine.precision.use_grad_scaler else None,
        faults=FaultInjector(config.faults, dist.rank),
        dist=dist,
        start_step=start_step,
        observers=observers,
        facts=facts,
        agreement=agreement(config, dist),
        noise=noise_scale(config, plan, tdev),
        growth=build_growth(config.training, lr_schedule, steps_from),
    )
    resume(run, state)
    if dist.is_main:  # last: a run refused above has written nothing
        start_logging(run, config, machine)
    return run


def noise_scale(config: TrainConfig, plan: BatchPlan, device: torch.device) -> NoiseScale | None:
    if not config.training.measures_noise:
        return None
    check_plan(plan.grad_accum_steps, plan.micro_batch_size, plan.effective_batch_size)
    t = config.training
    beta = t.adaptive_batch.smoothing if t.batch_schedule == "adaptive" else SMOOTHING
    return NoiseScale(plan.effective_batch_size, device, beta)


def build_optimizer(
    config: TrainConfig, model: torch.nn.Module, budget: TrainBudget
) -> torch.optim.Optimizer:
    """training.optimizer at the rate lr_scaling gives the run's first batch (under μP, the
    hidden matrices' groups at theirs)."""
    at_batch = dataclasses.replace(config.training, lr=budget.lr)
    hidden = mup_hidden(model, config.model)
    return OPTIMIZERS.get(config.training.optimizer).create(model, at_batch, hidden)


def at_resume(
    config: TrainConfig, state: ckpt.TrainState | None, budget: TrainBudget, plan: BatchPlan
) -> tuple[TrainBudget, BatchPlan, int]:
    """The budget, plan and first step a checkpoint resumes at (a fresh start: as given, 0). A
    batch that grew resumes at the batch it had reached, over its checkpoint's phases."""
    if state is None:
        return budget, plan, 0
    step = int(state.step)
    budget = resumed_budget(budget, state.batch_schedule, config.training)
    grown = plan.at_batch(budget.batch_at(step), config.training.measures_noise)
    return budget, grown, step


def resume(run: Run, state: ckpt.TrainState | None) -> None:
    if state is None:
        return
    try:
        restore(run, state)
    except (RuntimeError, KeyError, ValueError) as exc:  # another model's checkpoint
        raise ConfigError(
            f"training.resume: the checkpoint does not fit this model ({_two_lines(exc)}); "
            "resume with the model it was trained with"
        ) from None


def _two_lines(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return " ".join(lines[:2])[:300] if lines else first_line(exc)


def start_logging(run: Run, config: TrainConfig, machine: Machine) -> None:
    """The run dir, its loggers and trackers, and its tokenizer: the last refusals."""
    from app.engine.export import save_run_tokenizer

    run.run_dir.mkdir(parents=True, exist_ok=True)
    nvml = machine.device.index if machine.device.type == "cuda" else None
    study = config.hpo.study_name if config.hpo is not None and config.hpo.study_name else None
    sinks = build_sinks(config.tracking, run.run_dir, study)
    run.observers.logger = RunLogger(run.run_dir, nvml_index=nvml, sinks=sinks)
    # Saved now, from the data the run trains on: an export needs no data later. After the
    # trackers, the last refusal: a refused start never replaces a finished run's tokenizer.
    run.facts.tokenizer = save_run_tokenizer(run.task.export_tokenizer(config.data), run.run_dir)


def model_facts(
    config: TrainConfig, machine: Machine, task: Task, model: torch.nn.Module
) -> ModelFacts:
    shape = model_shape(model)
    seq = task.sequence_length(config.data)
    return ModelFacts(
        num_params=shape.num_params,
        flops_per_token=flops_per_token(
            shape.num_params, shape.n_layer, shape.n_head, shape.head_dim, seq
        ),
        peak_tflops=machine.device.peak_tflops.get(machine.precision.name),
        identity=model_identity(config),
    )


def probe_setup(
    config: TrainConfig, machine: Machine, task: Task, budget: TrainBudget
) -> ProbeSetup:
    ab = config.training.auto_batch
    folder = Path(ab.cache_dir) if ab.cache_dir else Path(config.data.cache_dir) / "autobatch"
    return ProbeSetup(
        training=config.training,
        model=config.model,
        faults=config.faults,
        machine=machine,
        task=task,
        seq_len=task.sequence_length(config.data),
        budget=budget,  # the run's, computed once
        cache_dir=folder if ab.cache else None,
    )


def choose_plan(
    setup: ProbeSetup, model: torch.nn.Module, data: TaskData, compiled: torch.nn.Module
) -> BatchPlan:
    t, dist = setup.training, setup.machine.dist
    fixed = t.fixed_micro_batch
    if fixed is None:
        plan = auto_plan(setup, model, data, compiled=compiled)
    else:
        plan = fixed_plan(t.effective_batch_size, fixed, dist.world_size, dist.rank)
    size = eval_micro_size(t.eval_micro_batch, plan.micro_batch_size)
    # Never more than the validation samples.
    return plan.with_eval_micro_batch(None if size is None else max(1, min(size, t.eval_samples)))


def finish(
    run: Run | None, summary: Summary, started: float, machine: Machine, observers: Observers
) -> None:
    dist = machine.dist
    if summary.status == Status.NOT_STARTED.value:
        shutdown(dist)
        return
    try:
        if run is not None:
            summarize_run(run, summary)
        summary.wall_time_s = time.perf_counter() - started
        if dist.is_main and summary.run_dir:
            write_summary(Path(summary.run_dir), summary)
            if run is not None:
                print(closing_line(summary), flush=True)
    finally:
        if observers.logger is not None:
            # Every way a run ends passes here: the trackers' runs end with its status.
            observers.logger.close(summary.to_json())
    observers.reporter.set_attrs(trial_attrs(summary))
    if run is not None:
        run.release_model()
    del run
    if torch.cuda.is_available():
        # Tensors held only by reference cycles (an OOM's traceback frames) go back to the
        # allocator now, not at the next automatic collection. A full collection walks every
        # object of torch and transformers (~0.15 s), so a CPU run leaves it to Python.
        gc.collect()
        torch.cuda.empty_cache()
    shutdown(dist)
