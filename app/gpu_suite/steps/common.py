"""What the steps share: the GPU sizes, their tiny CPU stand-ins, and building and reading a
trainer run."""

from __future__ import annotations

from pathlib import Path

from app.engine.records.summary import Summary
from app.gpu_suite import readers
from app.gpu_suite.context import StepContext

# key=value settings of a command line; a bool is written as Hydra's true/false
Overrides = dict[str, str | int | float | Path]

QUIET: Overrides = {"training.progress_bar": "false"}
# The dry run's model and data: a whole run takes a few seconds on two CPU cores.
TINY_MODEL: Overrides = {
    "model.n_layer": 1,
    "model.n_head": 2,
    "model.n_embd": 32,
    "model.max_position_embeddings": 64,
    "data.seq_len": 32,
    "data.builtin_num_docs": 300,
}
TINY: Overrides = {
    **TINY_MODEL,
    "training.effective_batch_size": 8,
    "training.max_steps": 6,
    "training.eval_every": 3,
    "training.eval_samples": 8,
    "training.warmup_steps": 2,
    "training.log_every": 1,
}
# Nothing the report reads is in the checkpoints or the exported model: skip what can be.
LEAN: Overrides = {"training.checkpoint_every": 0, "training.export": "false"}
# The GPU presets compile by default, and a compile costs a minute per shape and precision:
# only the default run (step 2), the bench's compiled variant (step 3) and the probe (step 4) pay
# it. The others measure what does not depend on it (recovery, precision, logging).
EAGER: Overrides = {"model.compile": "false"}
# The preset's own compile setting: on for every card's, off for the CPU's (the dry run's).
PRESET_COMPILE: Overrides = {"model.compile": "null"}
# With compile on, the probe and the run together compile a graph to train and one to evaluate
MAX_GRAPHS = 2
# GPT-2 small (124M) on random tokens at 1024 positions, the card's precision.
GPT2: Overrides = {
    "gpu": "auto",
    "model": "gpt2_small",
    "data": "synthetic",
    "data.seq_len": 1024,
    "precision": "auto",
    "training.lr": "6e-4",
    **EAGER,
    **LEAN,
}
GPT2_TINY: Overrides = {"model": "tiny_gpt2", **TINY, "data.synthetic_num_tokens": 20000}


def args(overrides: Overrides) -> list[str]:
    return [f"{k}={_text(v)}" for k, v in overrides.items()]


def _text(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def train(
    ctx: StepContext, run: str, gpu: Overrides, tiny: Overrides | None = None
) -> tuple[list[str], list[str] | None]:
    """`python -m app.train` with the GPU settings, and its dry-run twin with the tiny ones
    laid over them (None: the command needs a GPU). Both write to the same run dir."""
    common: Overrides = {**QUIET, "hydra.run.dir": run_dir(ctx, run)}
    gpu_argv = ctx.py("-m", "app.train", *args({**gpu, **common}))
    if tiny is None:
        return gpu_argv, None
    return gpu_argv, ctx.py("-m", "app.train", *args({**gpu, **tiny, **common}))


def run_dir(ctx: StepContext, run: str) -> Path:
    return ctx.dir / run


def log_of(ctx: StepContext, label: str) -> Path:
    rec = next(c for c in ctx.rec.commands if c.label == label)
    if rec.log is None:
        raise FileNotFoundError(f"{label} wrote no log")
    return ctx.suite.out / rec.log


# Left out of summary.json while None (a run that never evaluated, an unknown device's MFU)
OPTIONAL_FIGURES = ("initial_val_loss", "final_val_loss", "mfu", "peak_memory_fraction")


def run_figures(ctx: StepContext, s: Summary, prefix: str = "") -> None:
    """The figures every run reports, from its summary.json."""
    figures = {
        "status": s.status, "steps": s.steps, "preset": s.preset, "device_name": s.device_name,
        "dtype": s.dtype, "precision_reason": s.precision_reason,
        "micro_batch_size": s.micro_batch_size, "grad_accum_steps": s.grad_accum_steps,
        "effective_batch_size": s.effective_batch_size, "batch_source": s.batch_source,
        "initial_val_loss": s.initial_val.get("loss"), "final_val_loss": s.final_val.get("loss"),
        "tokens_per_sec": s.tokens_per_sec, "mfu": s.mfu,
        "peak_memory_fraction": s.peak_memory_fraction, "wall_time_s": s.wall_time_s,
    }  # fmt: skip
    for key, value in figures.items():
        if value is not None or key not in OPTIONAL_FIGURES:
            ctx.figure(prefix + key, value)
    if s.peak_memory_bytes:
        ctx.figure(prefix + "peak_memory_gib", round(s.peak_memory_bytes / 2**30, 2))


def probe_figures(ctx: StepContext, s: Summary) -> float | None:
    """What choosing the micro-batch cost the run (its search's seconds and steps, its compiled
    confirmation's seconds and graphs, the graphs of the whole run, the probe's share of the
    run's wall), with the compiled graphs checked; returns that share (None: not probed)."""
    probe = s.batch_details.probe
    if probe is None:
        return None
    for key in ("probe_seconds", "probe_steps", "chosen_by", "confirm_seconds", "graphs_compiled"):
        ctx.figure(key, getattr(probe, key))
    ctx.figure("compiled_graphs", s.compiled_graphs)
    share = probe.probe_seconds / s.wall_time_s if s.wall_time_s else None
    ctx.figure("probe share of the wall", share)
    if s.compiled_graphs is not None:
        few = s.compiled_graphs <= MAX_GRAPHS
        ctx.check(f"compiled: probe and run at most {MAX_GRAPHS} graphs", few, s.compiled_graphs)
    return share


def completed(ctx: StepContext, s: Summary, what: str) -> bool:
    return ctx.check(f"{what}: status completed", s.status == "completed", s.status)


def loss_fell(ctx: StepContext, s: Summary, what: str) -> bool:
    ok, detail = readers.loss_fell(s)
    return ctx.check(f"{what}: validation loss fell", ok, detail)
