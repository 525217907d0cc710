"""Step 5: out of memory for real, and injected in every phase.

A real OOM in an automatic run: the card is partly taken by another process (the memory hog)
after the probe measured it empty, so the cached micro-batch no longer fits; the run must
halve it, redo the step with the same effective batch, release the failed step's memory and
teach the cache, so that the next run starts below the size that ran out. A fixed
micro-batch far above what fits shows the halving from the first step. Injected OOMs
(`faults.*`) cover the forward, backward, optimizer and evaluation phases on the card.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from app.engine.records.summary import Summary
from app.gpu_suite import readers
from app.gpu_suite.context import StepContext
from app.gpu_suite.steps.common import (
    EAGER,
    GPT2,
    LEAN,
    TINY_MODEL,
    Overrides,
    completed,
    run_figures,
    train,
)
from app.gpu_suite.steps.memory import PROBE_SHAPE

HOG = (
    "import sys, time, torch; "
    "held = torch.ones(int(sys.argv[1]), dtype=torch.uint8, device='cuda'); "
    "torch.cuda.synchronize(); "
    "print(f'holding {held.numel() / 2**30:.1f} GiB', flush=True); "
    "time.sleep(3600)"
)
# Eager: the memory hog is sized from the probed peaks of two sizes, which the compiled probe
# measures eagerly but for the size it confirmed compiled. So this shape probes on its own
# (step 4's cache is of the compiled shape, another key).
SHAPE = {**PROBE_SHAPE, **EAGER, "training.max_steps": 5, "training.eval_every": 5}
SHAPE |= {"training.log_every": 1}
FORCED = {
    **GPT2,
    "training.micro_batch_size": 512,
    "training.effective_batch_size": 512,
    "training.max_steps": 3,
    "training.eval_every": 3,
    "training.eval_samples": 16,
    "training.log_every": 1,
}
PHASES = ("forward", "backward", "optimizer", "eval")
ALLOCATED = "system/gpu_memory_allocated_mb"


def oom(ctx: StepContext) -> None:
    cache = ctx.dir / "autobatch"
    shutil.rmtree(cache, ignore_errors=True)  # a rerun into the same DIR probes again
    where: Overrides = {"training.auto_batch.cache_dir": cache}
    first = shape_run(ctx, where)
    real_oom(ctx, where, first)
    forced_oom(ctx)
    for phase in PHASES:
        injected(ctx, phase)


def shape_run(ctx: StepContext, where: Overrides) -> Summary | None:
    gpu, _ = train(ctx, "before", {**SHAPE, **where})
    why = "not run in the dry run: step 4's second run is the same on the CPU"
    if ctx.sh("the shape's own micro-batch", gpu, limit_s=80, dry_skip=why).status != "ok":
        return None
    with ctx.reading("the first run"):
        s = readers.summary(ctx.dir / "before")
        run_figures(ctx, s, "before: ")
        return s
    return None


def hog_bytes(s: Summary) -> int | None:
    """What to hold so that the chosen micro-batch m no longer fits but m/2 still does: the
    card less the midpoint of their measured peaks, less 1 GiB for two CUDA contexts."""
    total, m = s.device_memory_bytes, s.micro_batch_size or 0
    peaks = {r.micro: r.peak_fraction for r in readers.candidates(s)}
    high = peaks.get(m)
    if not total or not high or m < 2:
        return None
    low = peaks.get(m // 2) or high / 2
    return int(total * (1 - (high + low) / 2) - 2**30)


def real_oom(ctx: StepContext, where: Overrides, first: Summary | None) -> None:
    size = hog_bytes(first) if first else None
    hog = ctx.py("-c", HOG, str(size) if size else "BYTES")
    if not ctx.dry and size is None:
        ctx.skip("memory hog", hog, "the first run gave no micro-batch above 1 with its peak")
        return
    ctx.figure("hog GiB", round(size / 2**30, 1) if size else None)
    gpu, _ = train(ctx, "pressed", {**SHAPE, **where})
    pressed = None
    with ctx.hold("memory hog", hog, ready="holding", limit_s=60) as ready:
        if ready or ctx.dry:
            pressed = ctx.sh("run while the hog holds memory", gpu, limit_s=90)
    gpu, _ = train(ctx, "after", {**SHAPE, **where, "training.max_steps": 3})
    after = ctx.sh("next run, without the hog", gpu, limit_s=70)
    done = pressed is not None and pressed.status == after.status == "ok"
    if ctx.dry or first is None or not done:
        return
    with ctx.reading("the runs around the OOM"):
        recovered_checks(ctx, first, readers.summary(ctx.dir / "pressed"))
        memory_back(ctx, ctx.dir / "before", ctx.dir / "pressed")
        learned = readers.summary(ctx.dir / "after")
        ctx.figure("after: micro_batch_size", learned.micro_batch_size)
        below = (learned.micro_batch_size or 0) < (first.micro_batch_size or 0)
        cached = learned.batch_source == "cached"
        what = "the cache learned: the next run takes a size below the one that ran out"
        ctx.check(what, below and cached, learned.batch_source)


def recovered_checks(ctx: StepContext, first: Summary, s: Summary) -> None:
    run_figures(ctx, s, "pressed: ")
    ctx.figure("pressed: oom_count", s.oom_count)
    completed(ctx, s, "run under pressure")
    real = s.oom_count >= 1 and s.batch_source == "reduced_after_oom"
    ctx.check("a real OOM, recovered by halving", real, f"oom_count={s.oom_count}")
    same_batch(ctx, s, first.effective_batch_size, "run under pressure")


def same_batch(ctx: StepContext, s: Summary, want: int | None, what: str) -> None:
    sizes = s.micro_batch_sizes
    ok = s.effective_batch_size == want and sum(sizes) * s.world_size == want
    ctx.check(f"{what}: effective batch unchanged", ok, f"{sizes} = {want}")


def memory_back(ctx: StepContext, before: Path, after: Path) -> None:
    was = readers.series(readers.metrics(before), ALLOCATED)
    now = readers.series(readers.metrics(after), ALLOCATED)
    if not was or not now:
        ctx.check("memory back to its level", False, f"no {ALLOCATED} in metrics.jsonl")
        return
    ctx.figure("allocated MiB at the last step: without / after an OOM", [was[-1], now[-1]])
    detail = f"{now[-1]:.0f} MiB vs {was[-1]:.0f} MiB"
    back = now[-1] <= 1.1 * was[-1]
    ctx.check("memory back to its level without the OOM (within 10 %)", back, detail)


def forced_oom(ctx: StepContext) -> None:
    where = {"training.auto_batch.cache_dir": ctx.dir / "autobatch-forced"}
    gpu, _ = train(ctx, "forced", {**FORCED, **where})
    if ctx.sh("micro-batch 512, far above what fits", gpu, limit_s=80).status != "ok":
        return
    with ctx.reading("the forced run"):
        s = readers.summary(ctx.dir / "forced")
        ctx.figure("forced: micro_batch_size", s.micro_batch_size)
        ctx.figure("forced: oom_count", s.oom_count)
        completed(ctx, s, "forced run")
        halved = s.oom_count >= 1 and (s.micro_batch_size or 512) < 512
        ctx.check("forced run: real OOMs, halved until it fits", halved)
        same_batch(ctx, s, 512, "forced run")


def oom_above(phase: str) -> int:
    """faults.oom_above_micro_batch: the largest micro-batch the injected OOM spares."""
    return 8 if phase == "eval" else 6


def injected_overrides(phase: str) -> Overrides:
    base: Overrides = {"gpu": "auto", **EAGER, **LEAN, "faults.oom_phase": phase}
    base |= {"faults.oom_from_step": 3}
    base |= {"training.max_steps": 8, "training.eval_every": 4, "training.log_every": 1}
    if phase == "eval":  # training's micro-batch fits; evaluation's, 4x larger, does not
        base |= {"training.micro_batch_size": 4, "training.eval_micro_batch_size": "auto"}
    else:
        base |= {"training.micro_batch_size": 16, "training.effective_batch_size": 32}
    return base | {"faults.oom_above_micro_batch": oom_above(phase)}


# The dry run keeps to two phases: backward and optimizer differ from forward only in the
# value of faults.oom_phase, which their settings check covers, and each run costs seconds.
DRY_PHASES = ("forward", "eval")


def injected(ctx: StepContext, phase: str) -> None:
    gpu = injected_overrides(phase)
    tiny = {**TINY_MODEL, "training.max_steps": 5, "training.eval_samples": 16}
    argv, dry = train(ctx, f"injected-{phase}", gpu, tiny if phase in DRY_PHASES else None)
    why = "not run in the dry run: as the forward phase, but for faults.oom_phase"
    if ctx.sh(f"injected OOM in {phase}", argv, dry=dry, limit_s=40, dry_skip=why).status != "ok":
        return
    with ctx.reading(f"the injected {phase} run"):
        s = readers.summary(ctx.dir / f"injected-{phase}")
        ctx.figure(f"{phase}: oom_count", s.oom_count)
        ctx.figure(f"{phase}: micro / eval micro", [s.micro_batch_size, s.eval_micro_batch_size])
        completed(ctx, s, phase)
        limit = oom_above(phase)
        key = "eval_micro_batch_size" if phase == "eval" else "micro_batch_size"
        size = s.eval_micro_batch_size if phase == "eval" else s.micro_batch_size
        fired = s.oom_count >= 1 and (size or limit + 1) <= limit
        ctx.check(f"{phase}: OOM fired and {key} halved to <= {limit}", fired)
        same_batch(ctx, s, 32, phase)
