"""One contender in this process: the trainer, the bare loop or the transformers Trainer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.bench.clock import StepClock
from app.bench.lockstep import Baton


def worker_main(spec_path: Path) -> int:
    spec = json.loads(spec_path.read_text())
    runner = {"trainer": work_trainer, "bare": work_bare, "hf": work_hf}[spec["contender"]]
    result = runner(spec)
    Path(spec["out"]).write_text(json.dumps(result))
    return 0


def _clock(spec: dict[str, Any], cfg, device) -> StepClock:
    baton = Baton(*spec["baton"]) if spec.get("baton") else None
    return StepClock(spec["start_time"], spec["warmup"], cfg.training.max_steps, device, baton)


def _compose(spec: dict[str, Any]):
    from app.preflight import compose

    total = spec["warmup"] + spec["steps"]
    return compose("train", [*spec["overrides"], f"training.max_steps={total}"])


def _result(
    clock: StepClock,
    cfg,
    final_loss: float,
    device_name: str,
    dtype: str,
    flops_tok: int | None,
    peak_tflops: float | None,
) -> dict[str, Any]:
    from app.telemetry import mfu

    seconds = clock.measured_seconds()
    tokens_per_step = cfg.training.effective_batch_size * cfg.data.seq_len
    tps = (clock.total - clock.warmup) * tokens_per_step / seconds
    peak, kind = clock.peak
    return {
        "tokens_per_sec": tps,
        "samples_per_sec": tps / cfg.data.seq_len,
        "tokens_per_step": tokens_per_step,
        "measured_seconds": seconds,
        "first_step_s": clock.first_step_s,
        "peak_memory_bytes": peak,
        "peak_memory_kind": kind,
        "final_loss": final_loss,
        "device_name": device_name,
        "dtype": dtype,
        "mfu": mfu(tps, flops_tok, peak_tflops) if flops_tok else None,
    }


def _device_setup(cfg, host_malloc: str):
    """Device, precision and the FLOPs/peak figures, resolved exactly as the trainer does, and a
    host malloc policy (app/hardware/host_malloc.py) for this process."""
    import torch

    from app.hardware.devices import detect_device, effective_preset
    from app.hardware.host_malloc import apply_host_malloc
    from app.hardware.precision import apply_precision_flags, resolve_precision

    apply_host_malloc(host_malloc)
    device = detect_device(cfg.gpu)
    preset = effective_preset(cfg.gpu, device)
    precision = resolve_precision(cfg.precision.name, device, preset)
    apply_precision_flags(precision)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    torch.manual_seed(cfg.training.seed)
    return device, preset, precision


def _flops(model, cfg, device, precision) -> tuple[int, float | None]:
    from app.model import model_shape
    from app.telemetry import flops_per_token

    s = model_shape(model)
    flops = flops_per_token(s.num_params, s.n_layer, s.n_head, s.head_dim, cfg.data.seq_len)
    return flops, device.peak_tflops.get(precision.name)


def work_trainer(spec: dict[str, Any]) -> dict[str, Any]:
    """The real `run_training`; the only addition is a timestamp after each optimizer step."""
    import torch

    import app.loop as loop
    from app.runner import run_training

    # Evaluation and checkpoints run after the last timed step; nothing else is changed.
    total = spec["warmup"] + spec["steps"]
    extra = [
        "training.eval_at_start=false",
        f"training.eval_every={total}",
        "training.checkpoint_every=0",
    ]
    cfg = _compose({**spec, "overrides": [*spec["overrides"], *extra]})
    device = torch.device("cuda" if _wants_cuda(cfg) else "cpu")
    clock = _clock(spec, cfg, device)
    inner = loop.step_with_recovery

    def timed(run, blocks, step):
        clock.before_step()
        out = inner(run, blocks, step)
        clock.step_done()
        return out

    loop.step_with_recovery = timed  # train() looks it up at call time
    try:
        summary = run_training(cfg, Path(spec["tmp"]) / "run")
    finally:
        loop.step_with_recovery = inner
    return _result(
        clock,
        cfg,
        summary["final_train_loss"],
        summary["device_name"],
        summary["dtype"],
        summary["flops_per_token"],
        summary["peak_tflops"],
    )


def _wants_cuda(cfg) -> bool:
    import torch

    return cfg.gpu.device_type != "cpu" and torch.cuda.is_available()


def _batch_plan(cfg) -> tuple[int, int]:
    eff, micro = cfg.training.effective_batch_size, cfg.training.micro_batch_size
    if eff % micro:
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


def work_bare(spec: dict[str, Any]) -> dict[str, Any]:
    """The floor: model, AdamW, autocast, clip, step. No loader, no logging, no framework."""
    import contextlib

    import torch
    import torch.nn.functional as F

    from app.data.tokens import load_token_data
    from app.model import build_model
    from app.optim import build_scheduler

    cfg = _compose(spec)
    # The floor gets every process setting the trainer has, the host malloc policy included.
    device, _, precision = _device_setup(cfg, cfg.training.host_malloc)
    dev = device.torch_device
    data = load_token_data(cfg.data)
    model = build_model(cfg.model, data.vocab_size).to(dev)
    flops, peak_tflops = _flops(model, cfg, device, precision)
    # Fused is the fastest AdamW on CUDA and, since torch 2.4, on CPU too (see --ablate).
    impl = spec["options"].get("adamw", "fused")
    opt = _adamw(model, cfg, impl)
    sched = build_scheduler(opt, cfg.training)  # the same warmup + cosine LambdaLR
    fwd = torch.compile(model) if cfg.model.compile else model
    micro, accum = _batch_plan(cfg)
    amp = (
        torch.autocast(dev.type, dtype=precision.autocast_dtype)
        if precision.autocast_dtype is not None
        else contextlib.nullcontext()
    )
    blocks = data.train.pin_memory() if dev.type == "cuda" else data.train
    gen = torch.Generator().manual_seed(cfg.data.seed)
    clock = _clock(spec, cfg, dev)
    model.train()
    for _ in range(cfg.training.max_steps):
        clock.before_step()
        idx = torch.randint(len(blocks), (micro * accum,), generator=gen)
        batch = blocks[idx].to(dev, non_blocking=True)
        for i in range(accum):
            part = batch[i * micro : (i + 1) * micro]
            with amp:
                logits = fwd(input_ids=part[:, :-1]).logits
            loss = F.cross_entropy(logits.float().flatten(0, 1), part[:, 1:].flatten()) / accum
            del logits  # else the next forward cannot reuse its memory: 1-3 % on CPU
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.training.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        clock.step_done()
    return _result(clock, cfg, loss.item() * accum, device.name, precision.name, flops, peak_tflops)


def work_hf(spec: dict[str, Any]) -> dict[str, Any]:
    """transformers.Trainer with the same model, batch plan, optimizer recipe and precision."""
    from transformers import TrainerCallback, TrainingArguments

    from app.data.loader import resolve_num_workers
    from app.data.tokens import load_token_data
    from app.model import build_model

    cfg = _compose(spec)
    # Stock, as users run it: glibc's malloc defaults unless an ablation arm asks otherwise.
    device, preset, precision = _device_setup(cfg, spec["options"].get("host_malloc", "default"))
    dev = device.torch_device
    data = load_token_data(cfg.data)
    model = build_model(cfg.model, data.vocab_size)
    flops, peak_tflops = _flops(model, cfg, device, precision)
    micro, accum = _batch_plan(cfg)
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
        max_steps=t.max_steps,
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
        dataloader_num_workers=resolve_num_workers(cfg.data.num_workers, preset.dataloader_workers),
        dataloader_drop_last=True,
        remove_unused_columns=False,
        logging_strategy="no",
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        seed=t.seed,
    )
    trainer = _hf_trainer(
        model=model, args=args, train_dataset=_HfBlocks(data.train), callbacks=[Clock()]
    )
    trainer.train()
    # With accumulation the Trainer divides each micro-batch's loss by the whole step's tokens.
    loss = float(trainer.last_loss) * accum
    return _result(clock, cfg, loss, device.name, precision.name, flops, peak_tflops)


def _hf_trainer(**kwargs):
    # Subclassed inside a function: transformers is imported only in the hf worker.
    from transformers import Trainer

    class LastLossTrainer(Trainer):
        """Keeps the last micro-batch loss (a device tensor: no sync) for the sanity column."""

        def compute_loss(self, model, inputs, *args, **kw):
            loss = super().compute_loss(model, inputs, *args, **kw)
            self.last_loss = (loss[0] if isinstance(loss, tuple) else loss).detach()
            return loss

    return LastLossTrainer(**kwargs)


class _HfBlocks:
    """Packed blocks as the Trainer wants them; the model shifts the labels itself."""

    def __init__(self, blocks) -> None:
        self.blocks = blocks

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> dict[str, Any]:
        x = self.blocks[i, :-1]
        return {"input_ids": x, "labels": x}
