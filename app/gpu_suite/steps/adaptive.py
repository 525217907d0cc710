"""Step 10: the adaptive batch on the card (`python -m app.bench --batch-schedule`, seed 0).

The CPU benchmark's question (docs/benchmarks.md, "A batch that follows the noise scale") on a
GPU: the tiny GPT-2 on the built-in corpus, the batch-budget grid of fixed batches against
adaptive runs from its smallest batch, eight runs at a time on the one card, each with the
probe's micro-batch (35 runs of a few seconds each after their start-up: two minutes). The
losses and steps answer the same question as on the CPU; the train seconds and the probe's
samples/s per batch say what the steps it saves are worth in wall time on a GPU, where a larger
batch runs more samples a second."""

from __future__ import annotations

import json
import math
import os

from app.bench.studies.batch_schedule import Arm
from app.config.training import AdaptiveBatchConfig
from app.gpu_suite.context import StepContext
from app.gpu_suite.steps.common import TINY_MODEL, Overrides, args

GPU: Overrides = {
    "gpu": "auto",
    "precision": "auto",
    "model.compile": "false",  # a compile per run and batch would be most of the step
    "training.micro_batch_size": "auto",
}
# The dry run: the tiny model, one LR and the shipped rule, a tenth of the budget.
DRY: Overrides = {**TINY_MODEL, "training.micro_batch_size": 4, "training.max_samples": 384}
# The shipped rule's fraction and its name in the bench's report: the goals are read on it
SHIPPED = AdaptiveBatchConfig().noise_fraction
GOAL_RULE = Arm("adaptive", 8, 0.0, SHIPPED).rule


def adaptive_batch(ctx: StepContext) -> None:
    path = ctx.dir / "batch_schedule.json"
    bench = ["-m", "app.bench", "--batch-schedule", "--seeds", "0", "--json", str(path)]
    lanes = ",".join(str(c) for c in range(min(8, os.cpu_count() or 1)))
    gpu = ctx.py(*bench, "--cores", lanes, *args(GPU))
    shipped = ["--lrs", "0.003", "--fractions", f"{SHIPPED:g}"]
    dry = ctx.py(*bench, "--cores", lanes, *shipped, *args(DRY))
    if ctx.sh("batch-schedule bench", gpu, dry=dry, limit_s=115).status != "ok":
        return
    with ctx.reading("the batch-schedule JSON"):
        seed = json.loads(path.read_text())["seeds"][0]
        schedule_figures(ctx, seed)
        if not ctx.dry:
            for goal, figures in seed["goals"][GOAL_RULE].items():
                ctx.check(f"adaptive batch: {goal}", figures["met"], figures, goal=True)


def schedule_figures(ctx: StepContext, seed: dict) -> None:
    """Per fixed batch (at its best LR) and per adaptive rule: loss, steps, train seconds and
    the probe's samples/s; a check that every run ended with a finite loss."""
    runs = seed["runs"]
    ended = all(math.isfinite(r["final_loss"]) for r in runs)
    ctx.check("every run of the grid ended with a validation loss", ended, len(runs))
    fixed = {r["batch"] for r in runs if r["schedule"] == "fixed"}
    shown = {
        f"fixed {b}": min(
            (r for r in runs if r["schedule"] == "fixed" and r["batch"] == b),
            key=lambda r: r["final_loss"],
        )
        for b in sorted(fixed)
    }
    shown |= {f"adaptive, {rule}": r for rule, r in seed["best_adaptive"].items()}
    for name, r in shown.items():
        ctx.figure(f"{name}: lr, loss, steps", [r["lr"], round(r["final_loss"], 4), r["steps"]])
        ctx.figure(f"{name}: train s", round(r["train_s"], 1))
        ctx.figure(f"{name}: probe samples/s", r["probe_samples_per_sec"])
        if r["batches"]:
            ctx.figure(f"{name}: batches", [(p["batch"], p["samples"]) for p in r["batches"]])
