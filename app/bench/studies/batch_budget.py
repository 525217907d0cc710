"""`python -m app.bench --batch-budget`: does a study pick the batch size (and learning rate) that
is truly best at a data budget?

Per seed (the training seed and the sampler's):

- the ground truth: `+sweeps=batch_size`, a grid of effective batch x learning rate, every run
  trained on the same 3,840 samples; its best (batch, LR) is the truth at that budget, and its
  curve and noise scale give the critical batch size two ways;
- three studies with the same search space (batch in {8, 16, 32, 64}, LR log-uniform), sampler
  (TPE, the study default), seed, trials and pruner (the default, successive halving):
  (a) `steps`: a fixed `training.max_steps=120` (3,840 samples at batch 32), what the study did
      before budgets in data; (b) `samples`: `training.max_samples=3840`; (c) `samples+sqrt`:
      the same with `training.lr_scaling=sqrt` (the searched LR is the LR at batch 32);
- each study's pick retrained on the grid's budget, its loss against the grid's best.

Reported per study: its pick, the pick's loss at the budget and how far it is from the grid's
best, and what the study cost (device-seconds of its trials, optimizer steps).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from typing import TypedDict

from app.bench.studies.hpo import Goals, Params, TrialRow, fatal_env, run_study
from app.engine.records.summary import Summary

BUDGET = 3840  # samples: 120 steps at batch 32
BATCHES = "choice(8, 16, 32, 64)"
GRID = [
    "+sweeps=batch_size",
    f"hydra.sweeper.params={{training.effective_batch_size:'{BATCHES}',"
    "training.lr:'choice(0.001, 0.002, 0.003, 0.005, 0.01)'}",
]
# The studies' common ground: the batch-size sweep's schedule (a warm-up over 320 samples, an
# evaluation every 160) with a search space of its own and the study defaults otherwise.
SPACE = (
    f"hydra.sweeper.params={{training.effective_batch_size:'{BATCHES}',"
    "training.lr:'tag(log, interval(0.001, 0.03))'}"
)
STUDY = [
    "+sweeps=batch_size",
    SPACE,
    "hpo.sampler=tpe",
    "hpo.pruner=successive_halving",
    "hpo.n_trials=12",
    "hpo.batch_size_study=null",
    "training.noise_scale=false",
]
ARMS = {
    # Steps as the study counted them before budgets in data: the counts are steps of each run.
    "steps": [
        "training.max_samples=null",
        f"training.max_steps={BUDGET // 32}",
        "training.reference_batch=32",
    ],
    "samples": [],
    "samples+sqrt": ["training.lr_scaling=sqrt"],
}
WITHIN = 0.01  # the goal: within 1 % of the grid's best


class Grid(TypedDict):
    """The grid's best (the truth at the budget) and the critical batch size two ways."""

    best_params: Params
    best_value: float
    device_seconds: float
    rows: list[dict[str, object]] | None
    critical_batch_curve: float | None
    curve_note: str | None
    critical_batch_noise: float | None
    target_loss: float | None


class Pick(TypedDict):
    """A study's pick, retrained on the grid's budget, and what the study cost."""

    pick: Params
    pick_value_in_study: float | None
    pick_at_budget: float
    vs_grid: float  # the pick's loss over the grid's best, less 1
    device_seconds: float
    optimizer_steps: int
    states: dict[str, int]
    wall_s: float


class SeedRun(TypedDict):
    grid: Grid
    studies: dict[str, Pick]


class BudgetReport(TypedDict):
    budget_samples: int
    seeds: dict[str, SeedRun]
    goals: Goals


def run_batch_budget_bench(extra: list[str], seeds: list[int]) -> BudgetReport:
    runs = {str(seed): run_seed(extra, seed) for seed in seeds}
    return {"budget_samples": BUDGET, "seeds": runs, "goals": goals(runs)}


def run_seed(extra: list[str], seed: int) -> SeedRun:
    seeded = [f"training.seed={seed}", f"hpo.seed={seed}"]
    grid = run_study([*GRID, *extra, *seeded], batch_size_study=True)
    truth = min(grid["trials"], key=_value)
    best = truth["value"]
    if best is None:
        raise SystemExit(f"seed {seed}: no trial of the grid completed")
    studies: dict[str, Pick] = {}
    for name, arm in ARMS.items():
        study = run_study([*STUDY, *extra, *seeded, *arm])
        pick = min((t for t in study["trials"] if t["state"] == "COMPLETE"), key=_value)
        scaling = [a for a in arm if a.startswith("training.lr_scaling=")]
        retrained = retrain(pick, [*extra, *seeded, *scaling])
        studies[name] = {
            "pick": pick["params"],
            "pick_value_in_study": pick["value"],
            "pick_at_budget": retrained,
            "vs_grid": retrained / best - 1.0,
            "device_seconds": sum(t["device_seconds"] or 0.0 for t in study["trials"]),
            "optimizer_steps": study["optimizer_steps"],
            "states": study["states"],
            "wall_s": study["wall_s"],
        }
    analysis = grid.get("batch_size_study") or {}
    return {
        "grid": {
            "best_params": truth["params"],
            "best_value": best,
            "device_seconds": sum(t["device_seconds"] or 0.0 for t in grid["trials"]),
            "rows": analysis.get("rows"),
            "critical_batch_curve": analysis.get("critical_batch_curve"),
            "curve_note": analysis.get("curve_note"),
            "critical_batch_noise": analysis.get("critical_batch_noise"),
            "target_loss": analysis.get("target_loss"),
        },
        "studies": studies,
    }


def retrain(pick: TrialRow, overrides: list[str]) -> float:
    """The pick's final validation loss when trained on the grid's budget, as the grid's runs
    are (`overrides` keep the arm's LR rule: a sqrt pick's LR is an LR at the reference
    batch)."""
    params = [f"{k}={v}" for k, v in pick["params"].items()]
    with tempfile.TemporaryDirectory(prefix="bench-retrain-") as tmp:
        cmd = [
            sys.executable, "-m", "app.train", "+sweeps=batch_size",
            *overrides, *params,
            f"hydra.run.dir={tmp}/run", f"data.cache_dir={tmp}/cache",
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, env=fatal_env())
        if proc.returncode != 0:
            raise SystemExit(f"retrain failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
        loss = Summary.read(f"{tmp}/run").final_val.get("loss")
    if loss is None:
        raise SystemExit(f"retrain ended without a validation loss: {' '.join(cmd)}")
    return loss


def _value(t: TrialRow) -> float:
    return float("inf") if t["value"] is None or t["state"] != "COMPLETE" else t["value"]


def goals(runs: dict[str, SeedRun]) -> Goals:
    """(b) or (c) within 1 % of the grid's best on every seed; the noise scale within a factor
    of 2 of the curve's critical batch size."""
    out: Goals = {}
    for name in ("samples", "samples+sqrt"):
        gaps = {seed: r["studies"][name]["vs_grid"] for seed, r in runs.items()}
        out[f"{name}_within_1pct"] = {"gaps": gaps, "met": all(g <= WITHIN for g in gaps.values())}
    ratios = {}
    for seed, r in runs.items():
        curve, noise = r["grid"]["critical_batch_curve"], r["grid"]["critical_batch_noise"]
        ratios[seed] = noise / curve if curve and noise else None
    met = all(x is not None and 0.5 <= x <= 2.0 for x in ratios.values())
    out["noise_scale_within_2x_of_curve"] = {"ratios": ratios, "met": met}
    return out


def batch_budget_table(report: BudgetReport) -> str:
    lines = [
        f"budget: {report['budget_samples']:,} samples; a pick is retrained on it",
        "",
        "| seed | study | pick: batch, lr | pick's loss at the budget | vs grid best | "
        "device-s | optimizer steps |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for seed, r in report["seeds"].items():
        g = r["grid"]
        lines.append(
            f"| {seed} | grid (truth) | {_params(g['best_params'])} | {g['best_value']:.4f} | "
            f"0 | {g['device_seconds']:.0f} | |"
        )
        for name, s in r["studies"].items():
            lines.append(
                f"| {seed} | {name} | {_params(s['pick'])} | {s['pick_at_budget']:.4f} | "
                f"{s['vs_grid'] * 100:+.1f} % | {s['device_seconds']:.0f} | "
                f"{s['optimizer_steps']:,} |"
            )
    lines.append("")
    for seed, r in report["seeds"].items():
        g = r["grid"]
        curve = g["critical_batch_curve"]
        shown = format(curve, ".1f") if curve else g["curve_note"]
        noise = g["critical_batch_noise"] or float("nan")
        lines.append(
            f"seed {seed}: critical batch from the curve {shown}, from the noise scale "
            f"{noise:.1f} (target loss {g['target_loss']:.4f})"
        )
    for goal, x in report["goals"].items():
        lines.append(f"goal {goal}: {'met' if x['met'] else 'MISSED'} {x}")
    return "\n".join(lines)


def _params(p: Params) -> str:
    batch = p.get("training.effective_batch_size")
    lr = p.get("training.lr")
    return f"{batch}, {lr:.3g}" if isinstance(lr, float) else f"{batch}, {lr}"
