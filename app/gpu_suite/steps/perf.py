"""Steps 3 and 9: GPT-2 small through the bench (eager and compiled, against the bare loop
and the transformers Trainer), and the NLI DeBERTa experiment's throughput."""

from __future__ import annotations

from app.bench.throughput.report import Row
from app.gpu_suite import readers
from app.gpu_suite.context import StepContext
from app.gpu_suite.steps.common import LEAN, Overrides, completed, run_figures, train

MFU_GOAL = 0.40  # compiled GPT-2 small on an H100 or H200: llm.c's, nanoGPT's and torchtitan's
# Compiling each contender takes about a minute on the card; eager runs take seconds.
BENCH_LIMITS = {"eager": 100.0, "compile": 315.0}


def bench(ctx: StepContext) -> None:
    rows: list[Row] = []
    for variant, limit in BENCH_LIMITS.items():
        path = ctx.dir / f"{variant}.json"
        gpu = ctx.py("-m", "app.bench", "--profile", "gpt2_small", "--rounds", "1")
        gpu += ["--variants", variant, "--json", str(path)]
        dry = None
        if variant == "eager":  # the bench's smallest profile on the CPU: the same report
            dry = ctx.py("-m", "app.bench", "--profile", "smoke", "--rounds", "1")
            dry += ["--json", str(path)]
        rec = ctx.sh(f"bench {variant}", gpu, dry=dry, limit_s=limit)
        if rec.status == "ok":
            with ctx.reading(f"bench {variant} JSON"):
                found = readers.bench_rows(path)
                bench_figures(ctx, found)
                rows += found
    if not ctx.dry:
        with ctx.reading("bench goals"):
            bench_goals(ctx, rows)


def bench_figures(ctx: StepContext, rows: list[Row]) -> None:
    for r in rows:
        name = f"{r['variant']} {r['contender']}"
        ctx.figure(f"{name} tokens/s", r.get("tokens_per_sec"))
        ctx.figure(f"{name} MFU", r.get("mfu"))
        peak = r.get("peak_memory_bytes")
        ctx.figure(f"{name} peak memory GiB", round(peak / 2**30, 2) if peak else None)
        ctx.figure(f"{name} vs bare", r.get("speed_ratio"))
        ctx.check(f"{name} ran", bool(r.get("runs_ok")), f"runs_ok={r.get('runs_ok')}")


def bench_goals(ctx: StepContext, rows: list[Row]) -> None:
    """The compiled trainer against its goals: MFU on a Hopper card (H100, H200), and at least
    the tokens/s of the bare loop and of the transformers Trainer, compiled alike."""
    none: Row = {}
    compiled = {r["contender"]: r for r in rows if r["variant"] == "compile"}
    trainer = compiled.get("trainer", none)
    mfu, ours = trainer.get("mfu"), trainer.get("tokens_per_sec")
    if any(card in ctx.suite.device for card in ("H100", "H200")):
        ctx.check(f"compiled trainer MFU >= {MFU_GOAL:.0%} (H100/H200)", (mfu or 0) >= MFU_GOAL,
                  f"{mfu}", goal=True)  # fmt: skip
    for contender, name in (("bare", "the bare loop"), ("hf", "the transformers Trainer")):
        theirs = compiled.get(contender, none).get("tokens_per_sec")
        ahead = ours is not None and theirs is not None and ours >= theirs
        ctx.check(f"compiled trainer at least {name}'s tokens/s", ahead, f"{ours} vs {theirs}",
                  goal=True)  # fmt: skip


# DeBERTa-v3-base's shape without its weights (none on a machine without a network): 12
# layers, width 768, 12 heads, 3072 FFN, 512 positions, 128k vocabulary, relative attention.
DEBERTA_BASE_STEPS, DEBERTA_TINY_STEPS = 100, 4
DEBERTA_BASE: Overrides = {
    "experiment": "nli_deberta",
    "model": "tiny_deberta",
    "data": "tiny_nli",
    "model.n_layer": 12,
    "model.n_head": 12,
    "model.n_embd": 768,
    "model.intermediate_size": 3072,
    "model.max_position_embeddings": 512,
    "model.vocab_size": 128100,
    "training.max_steps": DEBERTA_BASE_STEPS,
    "training.eval_every": 100,
    "training.eval_samples": 512,
    "training.log_every": 10,
    "training.warmup_steps": 10,
    **LEAN,
}
DEBERTA_TINY: Overrides = {
    "model.n_layer": 1,
    "model.n_head": 2,
    "model.n_embd": 32,
    "model.intermediate_size": 64,
    "model.max_position_embeddings": 128,
    "model.vocab_size": "null",
    "data.builtin_num_docs": 600,
    "data.max_length": 64,
    "training.effective_batch_size": 8,
    "training.max_steps": DEBERTA_TINY_STEPS,
    "training.eval_every": 4,
    "training.eval_samples": 16,
    "training.log_every": 1,
    "training.warmup_steps": 1,
}


def deberta(ctx: StepContext) -> None:
    gpu, dry = train(ctx, "run", DEBERTA_BASE, DEBERTA_TINY)
    rec = ctx.sh("nli_deberta", gpu, dry=dry, limit_s=130)
    if rec.status != "ok":
        return
    with ctx.reading("the run"):
        run = ctx.dir / "run"
        s = readers.summary(run)
        run_figures(ctx, s)
        ctx.figure("final_val_accuracy", s.final_val.get("accuracy"))
        rate = readers.median(readers.series(readers.metrics(run), "train/samples_per_sec"))
        ctx.figure("samples/s (median of log windows)", rate)
        completed(ctx, s, "run")
        want = DEBERTA_TINY_STEPS if ctx.dry else DEBERTA_BASE_STEPS
        ctx.check("trained every step", s.steps == want, f"{s.steps} of {want}")
