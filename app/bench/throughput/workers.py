"""One contender in this process: the trainer, the bare loop or the transformers Trainer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, NotRequired, TypedDict

from app.bench.throughput.clock import StepClock
from app.bench.throughput.lockstep import Baton
from app.bench.throughput.report import RunResult

if TYPE_CHECKING:
    from app.config.schema import TrainConfig
    from app.engine.run import Run, Samples


class Spec(TypedDict):
    """What a worker runs (spec.json, written by app/bench/throughput/schedule.py)."""

    contender: str  # trainer | bare | hf
    overrides: list[str]
    options: dict[str, str]  # the arm's contender-specific knobs (profiles.Arm)
    warmup: int
    steps: int
    tmp: str  # the run's scratch directory
    out: str  # where the worker writes its RunResult
    baton: NotRequired[list[int] | None]  # lockstep: the worker's (go, done) pipe ends
    start_time: NotRequired[float]  # time.time() as the worker was launched


def worker_main(spec_path: Path) -> int:
    spec: Spec = json.loads(spec_path.read_text())
    runner = {"trainer": work_trainer, "bare": work_bare, "hf": work_hf}[spec["contender"]]
    result = runner(spec)
    Path(spec["out"]).write_text(json.dumps(result))
    return 0


def _clock(spec: Spec, cfg, device) -> StepClock:
    ends = spec.get("baton")
    baton = Baton(*ends) if ends else None
    return StepClock(spec["start_time"], spec["warmup"], cfg.budget().max_steps, device, baton)


def _compose(spec: Spec) -> TrainConfig:
    from app.config.compose import compose
    from app.config.schema import load_config

    total = spec["warmup"] + spec["steps"]
    return load_config(compose("train", [*spec["overrides"], f"training.max_steps={total}"]))


def _result(
    clock: StepClock,
    cfg,
    unit: str,
    final_loss: float,
    device_name: str,
    dtype: str,
    flops_tok: int | None,
    peak_tflops: float | None,
) -> RunResult:
    """Throughput in tokens that carry data and in samples (the work the clock counted over the
    measured steps); `unit` says which one the task reports (app/bench/throughput/tasks.py)."""
    from app.engine.records.telemetry import mfu

    seconds = clock.measured_seconds()
    steps = clock.total - clock.warmup
    tokens, padded = int(clock.tokens), int(clock.padded)
    tps = tokens / seconds
    return {
        "unit": unit,
        "tokens_per_sec": tps,
        "samples_per_sec": steps * cfg.training.effective_batch_size / seconds,
        "tokens_per_step": tokens / steps,
        "samples_per_step": cfg.training.effective_batch_size,
        "padding": 1 - tokens / padded if padded else 0.0,  # share of the computed tokens
        "measured_seconds": seconds,
        "first_step_s": clock.first_step_s,
        "peak_memory_bytes": clock.peak[0],
        "peak_memory_kind": clock.peak[1],
        "final_loss": final_loss,
        "device_name": device_name,
        "dtype": dtype,
        "mfu": mfu(tps, flops_tok, peak_tflops) if flops_tok else None,
    }


def _device_setup(cfg, host_malloc: str):
    """Device, precision and the FLOPs/peak figures, resolved exactly as the trainer does, and a
    host malloc policy (app/components/hardware/host_malloc.py) for this process."""
    import torch

    from app.components.hardware.devices import detect_device, effective_preset
    from app.components.hardware.host_malloc import apply_host_malloc
    from app.components.hardware.precision import apply_precision_flags, resolve_precision

    apply_host_malloc(host_malloc)
    device = detect_device(cfg.gpu)
    preset = effective_preset(cfg.gpu, device)
    precision = resolve_precision(cfg.precision.name, device, preset)
    apply_precision_flags(precision)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    torch.manual_seed(cfg.training.seed)
    return device, preset, precision


def _flops(model, cfg, device, precision, task) -> tuple[int, float | None]:
    from app.components.models.shape import model_shape
    from app.engine.records.telemetry import flops_per_token

    s = model_shape(model)
    seq = task.sequence_length(cfg.data)
    flops = flops_per_token(s.num_params, s.n_layer, s.n_head, s.head_dim, seq)
    return flops, device.peak_tflops.get(precision.name)


def work_trainer(spec: Spec) -> RunResult:
    """The real `run_training`; the only addition is a timestamp after each optimizer step."""
    import torch

    from app.bench.throughput.tasks import bench_task
    from app.engine.run import Observers, StepHooks
    from app.engine.runner import run_training

    # Evaluation and checkpoints run after the last timed step; nothing else is changed.
    total = spec["warmup"] + spec["steps"]
    extra = [
        "training.eval_at_start=false",
        f"training.eval_every={total}",
        "training.checkpoint_every=0",
    ]
    cfg = _compose({**spec, "overrides": [*spec["overrides"], *extra]})
    bench = bench_task(cfg)
    device = torch.device("cuda" if _wants_cuda(cfg) else "cpu")
    clock = _clock(spec, cfg, device)

    class Timed(StepHooks):
        def on_step_start(self, run: Run, step: int, batch: Samples) -> None:
            clock.before_step()
            clock.count(*bench.step_work(batch, run.plan.micro_sizes))

        def on_step_end(self, run: Run, step: int) -> None:
            clock.step_done()

    summary = run_training(cfg, Path(spec["tmp"]) / "run", Observers(hooks=Timed()))
    return _result(
        clock,
        cfg,
        bench.unit,
        summary.final_train_loss or float("nan"),
        summary.device_name or "",
        summary.dtype or "",
        summary.flops_per_token,
        summary.peak_tflops,
    )


def _wants_cuda(cfg) -> bool:
    import torch

    return cfg.gpu.device_type != "cpu" and torch.cuda.is_available()


def _batch_plan(cfg) -> tuple[int, int]:
    eff, micro = cfg.training.effective_batch_size, cfg.training.fixed_micro_batch
    if micro is None or eff % micro:
        raise SystemExit("bench needs training.effective_batch_size divisible by micro_batch_size")
    return micro, eff // micro


def _adamw(model, cfg, impl: str):
    import torch

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.training.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    kwargs = {"fused": True} if impl == "fused" else {"foreach": impl == "foreach"}
    t = cfg.training
    return torch.optim.AdamW(groups, lr=t.lr, betas=tuple(t.betas), eps=t.eps, **kwargs)


def work_bare(spec: Spec) -> RunResult:
    """The floor: model, AdamW, autocast, clip, step. No loader, no logging, no framework.
    What a step's samples are and how they are split is the task's
    (app/bench/throughput/tasks.py)."""
    import contextlib

    import torch

    from app.bench.throughput.tasks import bench_task
    from app.components.schedule import build_scheduler

    cfg = _compose(spec)
    # The floor gets every process setting the trainer has, the host malloc policy included.
    device, _, precision = _device_setup(cfg, cfg.training.host_malloc)
    dev = device.torch_device
    bench = bench_task(cfg)
    data = bench.task.load_data(cfg.data)
    model = bench.task.build_model(cfg.model, data).to(dev)
    flops, peak_tflops = _flops(model, cfg, device, precision, bench.task)
    # Fused is the fastest AdamW on CUDA and, since torch 2.4, on CPU too (see --ablate).
    impl = spec["options"].get("adamw", "fused")
    opt = _adamw(model, cfg, impl)
    budget = cfg.budget()
    sched = build_scheduler(opt, budget)  # the same warmup + cosine LambdaLR
    fwd = torch.compile(model) if cfg.model.compile else model
    micro, accum = _batch_plan(cfg)
    amp = (
        torch.autocast(dev.type, dtype=precision.autocast_dtype)
        if precision.autocast_dtype is not None
        else contextlib.nullcontext()
    )
    samples = data.train.pin_memory() if dev.type == "cuda" else data.train
    sample = bench.bare_sampler(data)
    sizes = [micro] * accum
    clock = _clock(spec, cfg, dev)
    model.train()
    for step in range(budget.max_steps):
        clock.before_step()
        batch = samples[sample(step)]
        clock.count(*bench.step_work(batch, sizes))
        loss = bench.bare_backward(fwd, batch, micro, accum, amp, dev)
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.training.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        clock.step_done()
    final = loss.item() * accum
    return _result(clock, cfg, bench.unit, final, device.name, precision.name, flops, peak_tflops)


def work_hf(spec: Spec) -> RunResult:
    """transformers.Trainer with the same model, batch plan, optimizer recipe and precision; the
    dataset, collator and sampling a Trainer user would pick for the task
    (app/bench/throughput/tasks.py)."""
    from transformers import TrainerCallback, TrainingArguments

    from app.bench.throughput.tasks import bench_task
    from app.components.data.loader import resolve_num_workers

    cfg = _compose(spec)
    # Stock, as users run it: glibc's malloc defaults unless an ablation arm asks otherwise.
    device, preset, precision = _device_setup(cfg, spec["options"].get("host_malloc", "default"))
    dev = device.torch_device
    bench = bench_task(cfg)
    data = bench.task.load_data(cfg.data)
    model = bench.task.build_model(cfg.model, data)
    flops, peak_tflops = _flops(model, cfg, device, precision, bench.task)
    micro, accum = _batch_plan(cfg)
    train_dataset, task_args, task_kwargs = bench.hf_setup(data)
    clock = _clock(spec, cfg, dev)

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            clock.before_step()

        def on_step_end(self, args, state, control, **kwargs):
            clock.step_done()

    t = cfg.training
    args = TrainingArguments(
        output_dir=str(Path(spec["tmp"]) / "hf"),
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=accum,
        max_steps=cfg.budget().max_steps,
        learning_rate=t.lr,
        weight_decay=t.weight_decay,
        adam_beta1=t.betas[0],
        adam_beta2=t.betas[1],
        adam_epsilon=t.eps,
        max_grad_norm=t.max_grad_norm,
        lr_scheduler_type="cosine",
        warmup_steps=t.warmup_steps,
        # optim stays at its default, as users run it: adamw_torch_fused (torch >= 2.8).
        bf16=precision.name == "bf16",
        fp16=precision.name == "fp16",
        torch_compile=bool(cfg.model.compile),
        use_cpu=dev.type == "cpu",
        dataloader_num_workers=resolve_num_workers(
            cfg.data.fixed_num_workers, preset.dataloader_workers
        ),
        dataloader_drop_last=True,
        logging_strategy="no",
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        seed=t.seed,
        **task_args,
    )
    trainer = _hf_trainer(
        clock,
        model=model,
        args=args,
        train_dataset=train_dataset,
        callbacks=[Clock()],
        **task_kwargs,
    )
    trainer.train()
    loss = bench.hf_micro_loss(float(trainer.last_loss), accum)
    return _result(clock, cfg, bench.unit, loss, device.name, precision.name, flops, peak_tflops)


def _hf_trainer(clock: StepClock, **kwargs):
    # Subclassed inside a function: transformers is imported only in the hf worker.
    from transformers import Trainer

    class LastLossTrainer(Trainer):
        """Keeps the last micro-batch loss (a device tensor: no sync) for the sanity column and
        counts the tokens of each micro-batch, with and without padding, for the clock."""

        def compute_loss(self, model, inputs, *args, **kw):
            ids, mask = inputs["input_ids"], inputs.get("attention_mask")
            clock.count(ids.numel() if mask is None else mask.sum(), ids.numel())
            loss = super().compute_loss(model, inputs, *args, **kw)
            self.last_loss = (loss[0] if isinstance(loss, tuple) else loss).detach()
            return loss

    return LastLossTrainer(**kwargs)
