"""Steps 6 and 7: every precision for a few hundred steps, and the NVML scalars with what
logging every step costs."""

from __future__ import annotations

from app.gpu_suite import readers
from app.gpu_suite.context import StepContext
from app.gpu_suite.steps.common import (
    EAGER,
    GPT2,
    GPT2_TINY,
    LEAN,
    TINY,
    completed,
    log_of,
    loss_fell,
    train,
)

PRECISIONS = ("auto", "bf16", "fp16", "tf32", "fp32")


def precision(ctx: StepContext) -> None:
    """The default model's 300 steps in each precision; on the CPU only fp32 (the others are
    CUDA's: autocast on the card, GradScaler, TF32 tensor cores)."""
    for p in PRECISIONS:
        gpu, dry = train(
            ctx, p, {"gpu": "auto", "precision": p, **EAGER, **LEAN}, TINY if p == "fp32" else None
        )
        if ctx.sh(f"precision={p}", gpu, dry=dry, limit_s=60).status != "ok":
            continue
        with ctx.reading(f"precision={p}"):
            s = readers.summary(ctx.dir / p)
            figures: dict[str, object] = {"dtype": s.dtype, "precision_reason": s.precision_reason}
            figures |= {"final_val_loss": s.final_val.get("loss")}
            figures |= {"tokens_per_sec": s.tokens_per_sec, "mfu": s.mfu}
            for key, value in figures.items():
                ctx.figure(f"{p}: {key}", value)
            completed(ctx, s, p)
            loss_fell(ctx, s, p)
            want = ("bf16", "fp16") if p == "auto" and not ctx.dry else (p,)
            if p != "auto" or not ctx.dry:
                ctx.check(f"{p}: trained in {'/'.join(want)}", s.dtype in want, s.dtype)


NVML = (
    "system/gpu_utilization_pct",
    "system/gpu_memory_used_mb",
    "system/gpu_power_w",
    "system/gpu_temperature_c",
)
# GPT-2 small, 16 x 1024 tokens a step: short steps, where a per-step cost would show.
CADENCE = {
    **GPT2,
    "training.micro_batch_size": 16,
    "training.effective_batch_size": 16,
    "training.max_steps": 150,
    "training.warmup_steps": 10,
    "training.eval_every": 150,
    "training.eval_at_start": "false",
    "training.eval_samples": 16,
}
TAGS = "TensorBoard scalar tags"
COST_GOAL = 0.01  # log_every=1 within 1 % of log_every=1000 (docs/benchmarks.md)


CADENCE_TINY = {**GPT2_TINY, "training.micro_batch_size": 4}


def nvml(ctx: StepContext) -> None:
    every: dict[int, float | None] = {}
    for n in (1, 1000):
        tiny = CADENCE_TINY if n == 1 else None  # on the CPU, the scalars' parsing only
        gpu, dry = train(ctx, f"log_every_{n}", {**CADENCE, "training.log_every": n}, tiny)
        if ctx.sh(f"log_every={n}", gpu, dry=dry, limit_s=55).status == "ok":
            with ctx.reading(f"log_every={n}"):
                every[n] = readers.summary(ctx.dir / f"log_every_{n}").tokens_per_sec
                ctx.figure(f"log_every={n}: tokens/s", every[n])
    run = ctx.dir / "log_every_1"
    argv = ctx.py("-c", readers.tensorboard_tags_script(), str(run / "tensorboard"))
    tags_ok = ctx.sh(TAGS, argv, dry=argv, limit_s=25).status == "ok"
    with ctx.reading("metrics.jsonl and TensorBoard"):
        rows = readers.metrics(run)
        tags = readers.tags_from_log(log_of(ctx, TAGS)) if tags_ok else []
        scalar_checks(ctx, rows, tags)
    if 1 in every and 1000 in every and every[1] and every[1000]:
        cost = 1 - every[1] / every[1000]
        ctx.figure("log_every=1 step-time cost", round(cost, 4))
        ctx.check(
            f"logging every step costs under {COST_GOAL:.0%}",
            cost < COST_GOAL,
            f"{cost:.2%}",
            goal=True,
        )


def scalar_checks(ctx: StepContext, rows: list[readers.MetricsRow], tags: list[str]) -> None:
    ctx.figure("system/* tags in TensorBoard", [t for t in tags if t.startswith("system/")])
    ctx.check("TensorBoard has the training loss", "train/loss" in tags)
    for key in (*NVML, "system/gpu_memory_allocated_mb"):
        ctx.figure(f"median {key}", readers.median(readers.series(rows, key)))
    if ctx.dry:
        return
    missing = [k for k in NVML if not readers.series(rows, k)]
    ctx.check("NVML scalars in metrics.jsonl", not missing, f"missing {missing}" if missing else "")
    absent = [k for k in NVML if k not in tags]
    ctx.check("NVML scalars in TensorBoard", not absent, f"missing {absent}" if absent else "")
