"""`python -m app.bench --sampler-choice`: which sampler the default study (`-m hpo=optuna`)
should use, by measurement.

Two studies, each run once per sampler arm and seed (`hpo.seed`, the sampler's):

- `default`: `-m hpo=optuna` as shipped: its search space, its budget (hpo.budget_trials: 20
  full trials' worth of training, at equal data), its pruner (successive halving);
- `bench`: the study of `python -m app.bench --hpo` (app/bench/hpo.py: sweeps/tiny_cpu.yaml's
  space, 16 trials of 120 steps) with its default pruner.

The arms spell every argument they depend on, so that they mean the same whatever the default
of `hpo=optuna` is:

- `tpe-before`: TPE as `hpo.sampler=tpe` configured it before (the stock config's fields:
  univariate, 10 random start-up trials; constant liar as the installed Optuna defaults it);
- `tpe-optuna5`: TPE as Optuna 5 configures it: multivariate, constant liar, 10 start-up trials
  (`group` changes nothing in a space without conditional parameters: it splits the space into
  the groups of parameters sampled together, and here there is one);
- `tpe-startup`: the same with a start-up count that follows the budget: a quarter of it (5 of
  20), so that three quarters of the study is guided rather than half;
- `gp`: GPSampler (Optuna 5's stable Gaussian process; it fits completed trials only).

Every study of one kind shares one micro-batch cache, so every arm trains each batch size with
the same micro-batch (the first probe's) and values do not depend on the machine's load. Per
study: its best value, trials by state, samples trained, wall and CPU seconds. The partial
results are written after each study (`<json>.partial.jsonl`).
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path
from typing import TypedDict

from app.bench.hpo import STUDY as BENCH_STUDY
from app.bench.hpo import StudyResult, run_study

ARMS: dict[str, list[str]] = {
    "tpe-before": ["hpo.sampler=tpe", "hpo.sampler_args={multivariate:false}"],
    "tpe-optuna5": [
        "hpo.sampler=tpe",
        "hpo.sampler_args={multivariate:true,constant_liar:true,n_startup_trials:10}",
    ],
    "tpe-startup": [
        "hpo.sampler=tpe",
        "hpo.sampler_args={multivariate:true,constant_liar:true,n_startup_trials:5}",
    ],
    "gp": ["hpo.sampler=gp", "hpo.sampler_args={n_startup_trials:10}"],
}
STUDIES: dict[str, list[str]] = {
    "default": ["hpo=optuna", "training.progress_bar=false"],
    "bench": [o for o in BENCH_STUDY if not o.startswith(("hpo.sampler=", "hpo.seed="))],
}


class ArmRun(TypedDict):
    study: str
    arm: str
    seed: int
    best_value: float | None
    states: dict[str, int]
    trials: int
    samples: int  # trained by all the study's trials
    wall_s: float
    cpu_s: float


class SamplerChoice(TypedDict):
    runs: list[ArmRun]
    # per study and arm: the median over seeds of the best value
    medians: dict[str, dict[str, float | None]]


def run_sampler_choice(
    extra: list[str], seeds: list[int], arms: list[str], studies: list[str], partial: Path
) -> SamplerChoice:
    runs: list[ArmRun] = []
    for study in studies:
        with tempfile.TemporaryDirectory(prefix="bench-sampler-") as shared:
            for seed in seeds:
                for arm in arms:
                    overrides = [
                        *STUDIES[study],
                        f"training.auto_batch.cache_dir={shared}/autobatch",
                        *extra,
                        *ARMS[arm],
                        f"hpo.seed={seed}",
                    ]
                    runs.append(_row(study, arm, seed, run_study(overrides)))
                    with partial.open("a") as f:
                        f.write(json.dumps(runs[-1]) + "\n")
    return {"runs": runs, "medians": _medians(runs)}


def _row(study: str, arm: str, seed: int, result: StudyResult) -> ArmRun:
    samples = sum(
        t["steps"] * int(str(t["params"].get("training.effective_batch_size", 0)))
        for t in result["trials"]
    )
    return {
        "study": study,
        "arm": arm,
        "seed": seed,
        "best_value": result["best_value"],
        "states": result["states"],
        "trials": len(result["trials"]),
        "samples": samples,
        "wall_s": result["wall_s"],
        "cpu_s": result["cpu_s"],
    }


def _medians(runs: list[ArmRun]) -> dict[str, dict[str, float | None]]:
    out: dict[str, dict[str, float | None]] = {}
    for r in runs:
        out.setdefault(r["study"], {}).setdefault(r["arm"], None)
    for study, arms in out.items():
        for arm in arms:
            values = [
                v
                for r in runs
                if r["study"] == study and r["arm"] == arm and (v := r["best_value"]) is not None
            ]
            arms[arm] = statistics.median(values) if values else None
    return out


def sampler_choice_table(report: SamplerChoice) -> str:
    lines = [
        "| study | sampler | seed | best value | trials (state: n) | samples trained | wall s |",
        "|---|---|---:|---:|---|---:|---:|",
    ]
    for r in report["runs"]:
        states = ", ".join(f"{k.lower()}: {v}" for k, v in sorted(r["states"].items()))
        best = "n/a" if r["best_value"] is None else f"{r['best_value']:.4f}"
        lines.append(
            f"| {r['study']} | {r['arm']} | {r['seed']} | {best} | {states} | "
            f"{r['samples']:,} | {r['wall_s']:.0f} |"
        )
    lines += ["", "| study | sampler | median best over seeds |", "|---|---|---:|"]
    for study, arms in report["medians"].items():
        for arm, value in arms.items():
            lines.append(f"| {study} | {arm} | {'n/a' if value is None else f'{value:.4f}'} |")
    return "\n".join(lines)
