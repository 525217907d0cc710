"""`python -m app.bench --batch-schedule`: the adaptive batch against the grid's best fixed one.

Per seed, every run trained on the batch-budget bench's data budget and schedule (3,840 samples,
`+sweeps=batch_size` as one run: a warm-up over 320 samples, an evaluation every 160, the noise
scale measured; micro-batch 4, so that runs repeat to the last digit on any machine load):

- fixed: the grid of effective batch {8, 16, 32, 64} x LR {1e-3, 2e-3, 3e-3, 5e-3, 1e-2} (the
  batch-budget bench's, app/bench/studies/batch_budget.py); `training.max_samples=N` as an
  extra override trains every run on N samples instead;
- adaptive: `training.batch_schedule=adaptive` started at the grid's smallest batch and allowed
  its largest, once per LR of the grid, for each `training.adaptive_batch.noise_fraction` of
  FRACTIONS (the shipped 1 first: the batch doubles while the noise scale stays at or above
  fraction x the batch) and each `training.lr_scaling` asked for (`--lr-scalings`; `none`, the
  default, keeps the rate as the batch grows, `sqrt` raises it by sqrt(2) at each doubling). The
  grid's LR is the rate at the start batch in every case (training.lr is set for the reference
  batch it is read at).

Goals per seed and rule (fraction and LR scaling; the adaptive batch's issue), the adaptive run
being the best over the LRs: it ends within 1 % of the best fixed run's final loss, with at least
30 % fewer optimizer steps than that run, and lower than every fixed batch that takes as few
steps (at its best LR).
`--cores 0,1` runs them side by side, each pinned to one core (with OMP_NUM_THREADS=1): the
losses and steps do not depend on it, the wall times do.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from app.bench.studies.hpo import Goals, run_child
from app.bench.studies.lanes import Task, run_on_cores
from app.bench.studies.paired_loss import PairedGap, paired_gap
from app.config.budget import lr_factor
from app.config.compose import compose
from app.engine.records.summary import Summary

BATCHES = (8, 16, 32, 64)
LRS = (0.001, 0.002, 0.003, 0.005, 0.01)
FRACTIONS = (1.0, 2.0, 0.5)  # the shipped rule's, a more patient one, a readier one
WITHIN = 0.01  # within 1 % of the best fixed run's loss ...
FEWER_STEPS = 0.30  # ... with at least 30 % fewer optimizer steps
# The batch-size sweep's budget, schedule and noise scale, as single runs. The micro-batch is
# set: the noise scale's small batch is the step's first micro-batch, so the adaptive rule's
# doublings depend on it, and a micro-batch the probe picks by measured throughput would make
# them depend on the machine's load (an extra override, the GPU step's auto, still wins).
MICRO_BATCH = 4
SWEEP = ["+sweeps=batch_size", f"training.micro_batch_size={MICRO_BATCH}"]


class RunRow(TypedDict):
    """One training run: its settings, its end and its curve (step, samples seen, val loss)."""

    schedule: str  # fixed | adaptive
    batch: int  # the effective batch it started at
    lr: float  # the learning rate at that batch
    fraction: float | None  # the adaptive rule's noise_fraction
    lr_scaling: str  # how the adaptive run's rate follows its batch (none: kept)
    final_loss: float
    steps: int
    samples: int
    train_s: float  # training and evaluation seconds (the summary's), startup left out
    probe_samples_per_sec: float | None  # the probe's, at its first batch (auto micro-batch)
    curve: list[tuple[int, int, float]]
    batches: list[dict[str, int]] | None  # the adaptive run's phases: {step, samples, batch}
    wall_s: float


class SeedResult(TypedDict):
    seed: int
    runs: list[RunRow]
    best_fixed: RunRow
    best_adaptive: dict[str, RunRow]  # by rule (Arm.rule)
    goals: dict[str, Goals]  # by rule


class ScheduleReport(TypedDict):
    budget_samples: int
    cores: list[int] | None
    seeds: list[SeedResult]


@dataclass(frozen=True)
class Arm:
    """One run of a seed."""

    schedule: str  # fixed | adaptive
    batch: int  # the effective batch it starts at
    lr: float  # the learning rate at that batch
    fraction: float | None = None  # adaptive: the rule's noise_fraction
    lr_scaling: str = "none"  # adaptive: how the rate follows the batch

    @property
    def rule(self) -> str:
        """An adaptive run's rule, as the table and the report's keys name it."""
        scaled = "" if self.lr_scaling == "none" else f", lr {self.lr_scaling}"
        return f"fraction {self.fraction:g}{scaled}"


@dataclass(frozen=True)
class Grid:
    """The learning rates every batch is tried at, the adaptive rule's fractions and LR scalings
    (`--lrs`, `--fractions`, `--lr-scalings`: fewer, for a quick look or a test)."""

    lrs: tuple[float, ...] = LRS
    fractions: tuple[float, ...] = FRACTIONS
    lr_scalings: tuple[str, ...] = ("none",)

    def arms(self) -> list[Arm]:
        """Every run of a seed: the fixed batches, then the adaptive runs."""
        fixed = [Arm("fixed", b, lr) for b in BATCHES for lr in self.lrs]
        return fixed + [
            Arm("adaptive", BATCHES[0], lr, f, scaling)
            for f in self.fractions
            for scaling in self.lr_scalings
            for lr in self.lrs
        ]


def run_batch_schedule_bench(
    extra: list[str], seeds: list[int], cores: list[int] | None, grid: Grid = Grid()
) -> ScheduleReport:
    # The reference batch training.lr is read at (the batch-size sweep's unless overridden)
    reference = int(compose("train", [*SWEEP, *extra]).training.reference_batch)
    results = [_seed(extra, seed, cores, grid, reference) for seed in seeds]
    # The budget every run trained on (the batch-budget grid's unless training.max_samples is
    # overridden): the least any run saw, a run stopping at the first step past it
    seen = min(r["samples"] for s in results for r in s["runs"])
    return {"budget_samples": seen, "cores": cores, "seeds": results}


def _seed(
    extra: list[str], seed: int, cores: list[int] | None, grid: Grid, reference: int
) -> SeedResult:
    with tempfile.TemporaryDirectory(prefix="bench-batch-schedule-") as tmp:
        shared = [
            f"training.seed={seed}",
            f"data.cache_dir={tmp}/cache",
            f"training.auto_batch.cache_dir={tmp}/autobatch",
            *extra,
        ]
        tasks = {
            str(arm): Task(_runner(arm, shared, reference, f"{tmp}/{i}"))
            for i, arm in enumerate(grid.arms())
        }
        done = run_on_cores(tasks, cores)
        runs = [done[name] for name in tasks]
        fixed = [r for r in runs if r["schedule"] == "fixed"]
        adaptive = [r for r in runs if r["schedule"] == "adaptive"]
        best_fixed = min(fixed, key=lambda r: r["final_loss"])
        best = {
            rule: min((r for r in adaptive if _rule(r) == rule), key=lambda r: r["final_loss"])
            for rule in dict.fromkeys(_rule(r) for r in adaptive)  # in the grid's order
        }
        run_dir = {id(r): Path(f"{tmp}/{i}/run") for i, r in enumerate(runs)}
        gaps = {f: paired_gap(run_dir[id(r)], run_dir[id(best_fixed)]) for f, r in best.items()}
    return {
        "seed": seed,
        "runs": runs,
        "best_fixed": best_fixed,
        "best_adaptive": best,
        "goals": {f: goals(fixed, r, gaps[f]) for f, r in best.items()},
    }


def _runner(
    arm: Arm, shared: list[str], reference: int, where: str
) -> Callable[[int | None], RunRow]:
    # training.lr is read at the reference batch: the rate at the start batch is the grid's
    lr = arm.lr / lr_factor(arm.lr_scaling, arm.batch, reference)
    overrides = [
        *SWEEP,
        f"training.effective_batch_size={arm.batch}",
        f"training.lr={lr!r}",
        f"training.lr_scaling={arm.lr_scaling}",
        *shared,
    ]
    if arm.schedule == "adaptive":
        overrides += [
            "training.batch_schedule=adaptive",
            f"training.max_effective_batch={BATCHES[-1]}",
            f"training.adaptive_batch.noise_fraction={arm.fraction}",
        ]
    return lambda core: train_run(arm, overrides, Path(where), core)


def train_run(arm: Arm, overrides: list[str], where: Path, core: int | None) -> RunRow:
    """One `python -m app.train` run (on `core` where given): its row, from the run directory's
    summary.json and metrics.jsonl."""
    where.mkdir(parents=True)
    cmd = [sys.executable, "-m", "app.train", *overrides, f"hydra.run.dir={where}/run"]
    started = time.perf_counter()
    code, _, stderr = run_child(cmd, where / "stderr.log", core)
    if code != 0:
        raise SystemExit(f"run failed ({code}): {' '.join(cmd)}\n{stderr[-2000:]}")
    summary = Summary.read(where / "run")
    loss = summary.final_val.get("loss")
    if loss is None:
        raise SystemExit(f"run ended without a validation loss: {' '.join(cmd)}")
    return {
        "schedule": arm.schedule,
        "batch": arm.batch,
        "lr": arm.lr,
        "fraction": arm.fraction,
        "lr_scaling": arm.lr_scaling,
        "final_loss": loss,
        "steps": summary.steps,
        "samples": summary.samples_seen,
        "train_s": summary.train_time_s + (summary.eval_time_s or 0.0),
        "probe_samples_per_sec": summary.probe_samples_per_sec,
        "curve": curve(where / "run" / "metrics.jsonl"),
        "batches": summary.batch_schedule,
        "wall_s": time.perf_counter() - started,
    }


def curve(metrics: Path) -> list[tuple[int, int, float]]:
    """(step, samples seen, validation loss) at each evaluation of a run."""
    points = []
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        if "val/loss" in record and "data/samples_seen" in record:
            points.append((record["step"], int(record["data/samples_seen"]), record["val/loss"]))
    return points


def goals(fixed: list[RunRow], adaptive: RunRow, gap: PairedGap | None = None) -> Goals:
    """The issue's goals for one adaptive run; `gap`, where measured, puts the loss goal beside
    how wide a gap the validation set can tell (its paired standard error)."""
    best = min(fixed, key=lambda r: r["final_loss"])
    per_batch = {b: min(r["final_loss"] for r in fixed if r["batch"] == b) for b in BATCHES}
    steps = {b: next(r["steps"] for r in fixed if r["batch"] == b) for b in BATCHES}
    as_few = {b: v for b, v in per_batch.items() if steps[b] <= adaptive["steps"]}
    return {
        "within_1pct_of_the_best_fixed_loss": {
            "loss": adaptive["final_loss"],
            "best_fixed": best["final_loss"],
            "met": adaptive["final_loss"] <= best["final_loss"] * (1 + WITHIN),
            **({} if gap is None else {"paired_stderr": gap.stderr, "paired_samples": gap.samples}),
        },
        "at_least_30pct_fewer_steps_than_the_best_fixed": {
            "steps": adaptive["steps"],
            "best_fixed_steps": best["steps"],
            "met": adaptive["steps"] <= best["steps"] * (1 - FEWER_STEPS),
        },
        "below_every_fixed_batch_with_as_few_steps": {
            "fixed_losses": as_few,
            "met": all(adaptive["final_loss"] < v for v in as_few.values()),
        },
    }


def batch_schedule_table(report: ScheduleReport) -> str:
    lines = [
        f"budget: {report['budget_samples']:,} samples per run",
        "",
        "| seed | run | batch | best LR | final val loss | optimizer steps | train s | "
        "probe samples/s | batch@samples |",
        "|---:|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for s in report["seeds"]:
        for b in BATCHES:
            r = min(
                (r for r in s["runs"] if r["schedule"] == "fixed" and r["batch"] == b),
                key=lambda r: r["final_loss"],
            )
            lines.append(_row(s["seed"], f"fixed {b}", r))
        for rule, r in s["best_adaptive"].items():
            lines.append(_row(s["seed"], f"adaptive, {rule}", r))
    lines += ["", "| seed | rule | goal | met | figures |", "|---:|---|---|---|---|"]
    for s in report["seeds"]:
        for f, by_goal in s["goals"].items():
            lines += [
                f"| {s['seed']} | {f} | {g} | {x['met']} | {_figures(x)} |"
                for g, x in by_goal.items()
            ]
    return "\n".join(lines)


def _figures(goal: dict[str, object]) -> str:
    """The loss goal's gap to the best fixed run, with its paired standard error where
    measured; the steps goal's saving."""

    def num(key: str) -> float:
        value = goal[key]
        assert isinstance(value, int | float), (key, value)
        return float(value)

    if "best_fixed" in goal:
        gap = f"{100 * (num('loss') / num('best_fixed') - 1):+.2f} %"
        if "paired_stderr" in goal:
            gap += f" (paired s.e. {100 * num('paired_stderr'):.2f} %)"
        return gap
    if "best_fixed_steps" in goal:
        return f"{100 * (1 - num('steps') / num('best_fixed_steps')):.1f} % fewer"
    return ""


def _row(seed: int, name: str, r: RunRow) -> str:
    phases = " -> ".join(f"{p['batch']}@{p['samples']}" for p in r["batches"] or [])
    probe = r["probe_samples_per_sec"]
    return (
        f"| {seed} | {name} | {r['batch']} | {r['lr']:g} | {r['final_loss']:.4f} | "
        f"{r['steps']:,} | {r['train_s']:.1f} | {'-' if probe is None else f'{probe:,.0f}'} | "
        f"{phases or r['batch']} |"
    )


def plot_batch_schedule(report: ScheduleReport, path: Path) -> None:
    """Loss against samples and against steps, one line per run: each fixed batch at its best
    LR and the best adaptive run of each rule; a row per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = report["seeds"]
    fig, axes = plt.subplots(len(seeds), 2, figsize=(11, 4 * len(seeds)), squeeze=False)
    for row, s in zip(axes, seeds, strict=True):
        shown = [
            min(
                (r for r in s["runs"] if r["schedule"] == "fixed" and r["batch"] == b),
                key=lambda r: r["final_loss"],
            )
            for b in BATCHES
        ]
        for r in [*shown, *s["best_adaptive"].values()]:
            adaptive = r["schedule"] == "adaptive"
            label = f"adaptive from {r['batch']}, {_rule(r)}" if adaptive else f"fixed {r['batch']}"
            width = 2.5 if adaptive else 1.2
            for ax, x in zip(row, (1, 0), strict=True):
                ax.plot([p[x] for p in r["curve"]], [p[2] for p in r["curve"]],
                        label=f"{label}, lr {r['lr']:g}", linewidth=width)  # fmt: skip
        for ax, axis in zip(row, ("samples seen", "optimizer steps"), strict=True):
            ax.set(xlabel=axis, ylabel="validation loss", yscale="log")
            ax.set_title(f"seed {s['seed']}: loss against {axis}")
            ax.grid(alpha=0.3)
        row[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _rule(r: RunRow) -> str:
    return Arm(r["schedule"], r["batch"], r["lr"], r["fraction"], r["lr_scaling"]).rule
