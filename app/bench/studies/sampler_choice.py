"""`python -m app.bench --sampler-choice`: which sampler the default study (`-m hpo=optuna`)
should use, by measurement.

Two studies, each run once per sampler arm and seed (`hpo.seed`, the sampler's):

- `default`: `-m hpo=optuna` as shipped: its search space, its budget (hpo.budget_trials: 20
  full trials' worth of training, at equal data), its pruner (successive halving);
- `bench`: the study of `python -m app.bench --hpo` (app/bench/studies/hpo.py:
  sweeps/tiny_cpu.yaml's space, 16 trials of 120 steps) with its default pruner.

The arms spell every argument they depend on, so that they mean the same whatever the default
of `hpo=optuna` is:

- `tpe-before`: TPE as `hpo.sampler=tpe` configured it before (the stock config's fields:
  univariate, 10 random start-up trials) with constant liar;
- `tpe-now`: the same with 5 start-up trials, as `hpo.sampler=tpe` configures it for the
  default budget of 20 (a quarter of the budget; _study/_samplers.py, `startup_trials`);
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

from app.bench.studies.hpo import STUDY as BENCH_STUDY
from app.bench.studies.hpo import StudyResult, run_study

ARMS: dict[str, list[str]] = {
    "tpe-before": [
        "hpo.sampler=tpe",
        "hpo.sampler_args={multivariate:false,constant_liar:true,n_startup_trials:10}",
    ],
    "tpe-now": [
        "hpo.sampler=tpe",
        "hpo.sampler_args={multivariate:false,constant_liar:true,n_startup_trials:5}",
    ],
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


class Step(TypedDict):
    """A trial as it ended: the samples the study had trained by then, its value if complete."""

    number: int
    state: str
    value: float | None
    samples: int  # the study's, up to this trial's end
    at_s: float  # seconds since the study started


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
    # the best completed value once the study had trained half its samples (anytime quality)
    best_at_half: float | None
    steps: list[Step]


class SamplerChoice(TypedDict):
    runs: list[ArmRun]
    # per study and arm: the median over seeds of the best value
    medians: dict[str, dict[str, float | None]]
    # per study and "arm (end|half)": the mean gap to each seed's best of all arms
    regret: dict[str, dict[str, float]]


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
    return {"runs": runs, "medians": _medians(runs), "regret": _regret(runs)}


def _row(study: str, arm: str, seed: int, result: StudyResult) -> ArmRun:
    steps = _steps(result)
    samples = steps[-1]["samples"] if steps else 0
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
        "best_at_half": best_by(steps, samples / 2),
        "steps": steps,
    }


def _steps(result: StudyResult) -> list[Step]:
    """The study's trials in the order they ended, with the samples trained by each end."""
    ended = sorted(
        (t for t in result["trials"] if t["end"] is not None), key=lambda t: t["end"] or 0.0
    )
    out: list[Step] = []
    trained = 0
    for t in ended:
        trained += t["steps"] * int(str(t["params"].get("training.effective_batch_size", 0)))
        out.append(
            {
                "number": t["number"],
                "state": t["state"],
                "value": t["value"] if t["state"] == "COMPLETE" else None,
                "samples": trained,
                "at_s": (t["end"] or 0.0) - result["started_at"],
            }
        )
    return out


def best_by(steps: list[Step], samples: float) -> float | None:
    """The best completed value among the trials that ended by `samples` trained."""
    done = [v for s in steps if s["samples"] <= samples and (v := s["value"]) is not None]
    return min(done) if done else None


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


def _regret(runs: list[ArmRun]) -> dict[str, dict[str, float]]:
    """Per study and arm, the mean over seeds of how far its best is above the best any arm
    reached on that seed (0: the best of the seed), at the end and at half the samples."""
    out: dict[str, dict[str, float]] = {}
    for study in {r["study"] for r in runs}:
        mine = [r for r in runs if r["study"] == study]
        for arm in {r["arm"] for r in mine}:
            gaps = []
            for r in (r for r in mine if r["arm"] == arm):
                seed = [o["best_value"] for o in mine if o["seed"] == r["seed"]]
                floor = min(v for v in seed if v is not None)
                for key in ("best_value", "best_at_half"):
                    value = r[key]
                    gaps.append((key, float("inf") if value is None else value / floor - 1))
            for key, name in (("best_value", "end"), ("best_at_half", "half")):
                values = [g for k, g in gaps if k == key]
                out.setdefault(study, {})[f"{arm} ({name})"] = statistics.mean(values)
    return out


def sampler_choice_table(report: SamplerChoice) -> str:
    lines = [
        "| study | sampler | seed | best value | best at half the samples | trials (state: n) "
        "| samples trained | wall s |",
        "|---|---|---:|---:|---:|---|---:|---:|",
    ]
    for r in report["runs"]:
        states = ", ".join(f"{k.lower()}: {v}" for k, v in sorted(r["states"].items()))
        lines.append(
            f"| {r['study']} | {r['arm']} | {r['seed']} | {_value(r['best_value'])} | "
            f"{_value(r['best_at_half'])} | {states} | {r['samples']:,} | {r['wall_s']:.0f} |"
        )
    lines += ["", "| study | sampler | median best over seeds |", "|---|---|---:|"]
    for study, arms in report["medians"].items():
        for arm, value in arms.items():
            lines.append(f"| {study} | {arm} | {_value(value)} |")
    lines += ["", "| study | sampler (when) | mean gap to the seed's best |", "|---|---|---:|"]
    for study, gaps in report["regret"].items():
        for name, gap in sorted(gaps.items()):
            lines.append(f"| {study} | {name} | {100 * gap:.1f} % |")
    return "\n".join(lines)


def _value(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"
