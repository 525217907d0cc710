"""Step 4: the automatic micro-batch probe against the card's real allocator, 100 steps at the
size it chose, then a second run that takes the size from the cache; compiled as the card's
preset compiles (the probe's search eager, its choice confirmed compiled, which compiles the
run's graphs: 100 steps rather than 200 keep that compilation within the command's limit)."""

from __future__ import annotations

import shutil

from app.engine.records.summary import Summary
from app.gpu_suite import readers
from app.gpu_suite.context import StepContext
from app.gpu_suite.steps.common import (
    GPT2,
    GPT2_TINY,
    PRESET_COMPILE,
    completed,
    probe_figures,
    run_figures,
    train,
)

# Effective batch 128 of 1024 tokens: more than fits in one micro-batch of GPT-2 small on an
# 80 GB card, so the probe has to find the limit rather than stop at the effective batch.
PROBE_SHAPE = {
    **GPT2,
    **PRESET_COMPILE,
    "training.micro_batch_size": "auto",
    "training.effective_batch_size": 128,
    "training.warmup_steps": 20,
    "training.eval_samples": 64,
}
PROBE_RUN = {**PROBE_SHAPE, "training.max_steps": 100, "training.eval_every": 50}
CACHED_RUN = {**PROBE_SHAPE, "training.max_steps": 10, "training.eval_every": 10}
TINY_AUTO = {**GPT2_TINY, "training.micro_batch_size": "auto"}


def probe(ctx: StepContext) -> None:
    cache = ctx.dir / "autobatch"
    shutil.rmtree(cache, ignore_errors=True)  # a rerun into the same DIR probes again
    where = {"training.auto_batch.cache_dir": cache}
    gpu, dry = train(ctx, "probed", {**PROBE_RUN, **where}, TINY_AUTO)
    if ctx.sh("probe, then 100 steps", gpu, dry=dry, limit_s=190).status != "ok":
        return
    with ctx.reading("the probed run"):
        first = readers.summary(ctx.dir / "probed")
        probed_checks(ctx, first)
    gpu, dry = train(ctx, "cached", {**CACHED_RUN, **where}, {**TINY_AUTO, "training.max_steps": 3})
    if ctx.sh("second run, from the cache", gpu, dry=dry, limit_s=70).status != "ok":
        return
    with ctx.reading("the cached run"):
        second = readers.summary(ctx.dir / "cached")
        run_figures(ctx, second, "cached: ")
        source = second.batch_source
        ctx.check("second run: micro-batch from the cache", source == "cached", source)
        same = second.micro_batch_size == first.micro_batch_size
        ctx.check("second run: the same micro-batch", same, f"{second.micro_batch_size}")


def probed_checks(ctx: StepContext, s: Summary) -> None:
    run_figures(ctx, s)
    probe_figures(ctx, s)
    rows = readers.candidates(s)
    limit = readers.memory_limit_fraction(s)
    ctx.figure("memory_limit_fraction", limit)
    ctx.figure("fit", [r.micro for r in rows if r.fits])
    ctx.figure("failed", [r.micro for r in rows if not r.fits])
    completed(ctx, s, "probed run")
    ctx.check("micro-batch probed", s.batch_source == "probed", s.batch_source)
    if not ctx.dry:
        peak = s.peak_memory_fraction
        under = peak is not None and limit is not None and peak < limit
        ctx.check("peak memory over the run under 1 - headroom", under, f"{peak} < {limit}")
