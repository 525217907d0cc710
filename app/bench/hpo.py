"""`python -m app.bench --hpo`: what pruning saves, and where a short trial's time goes.

Pruning: the tiny CPU study (sweeps/tiny_cpu.yaml) with a random sampler, a fixed seed and a
fixed micro-batch, run once per pruner. Every study trains the same trials in the same order,
and a trial that is not pruned ends with the same value in each, so the pruned study's best can
be compared with the unpruned one's exactly. Reported per study: trials by state, optimizer
steps trained in all, wall time, the best value.

Short trials: a study of 10-step trials; for each trial after the first (which loads the data
and probes the micro-batch for the whole worker), the share of its wall time spent in optimizer
steps, and the seconds spent evaluating.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# The study: 16 trials of up to 120 steps, evaluated every 10, on the tiny model.
STUDY = [
    "+sweeps=tiny_cpu",
    "hpo.n_trials=16",
    "hpo.sampler=random",
    "hpo.seed=7",
    "training.max_steps=120",
    "training.eval_every=10",
    "training.micro_batch_size=8",
    "hpo.params={training.effective_batch_size:'choice(8, 16, 32)'}",
]
# The pruner each study runs with: the default of hpo=optuna (what tiny_cpu leaves), and none.
PRUNERS = {"default": [], "none": ["hpo.pruner=none"]}
# 10-step trials with the study defaults (automatic micro-batch, evaluation at the start and
# the end): the case where set-up and evaluation weigh most.
SHORT = [
    "+sweeps=tiny_cpu",
    "hpo.n_trials=6",
    "hpo.sampler=random",
    "hpo.seed=7",
    "hpo.pruner=none",
    "training.max_steps=10",
]


def run_hpo_bench(extra: list[str]) -> dict[str, Any]:
    # The pruner goes last, so that extra overrides cannot undo the "none" arm.
    studies = {name: run_study(STUDY + extra + args) for name, args in PRUNERS.items()}
    pruned, full = studies["default"], studies["none"]
    short = run_study(SHORT + extra)
    later = short["trials"][1:]  # the first trial also loads the data and probes
    return {
        "studies": studies,
        "steps_ratio": pruned["optimizer_steps"] / full["optimizer_steps"],
        "same_best": pruned["best_value"] == full["best_value"],
        "short_trials": {
            "train_share": statistics.median(t["train_share"] for t in later),
            "seconds": statistics.median(t["seconds"] for t in later),
            "eval_s": statistics.median(t["eval_s"] or 0.0 for t in later),
            "first_trial_s": short["trials"][0]["seconds"],
            "trials": short["trials"],
        },
    }


def run_study(overrides: list[str]) -> dict[str, Any]:
    import optuna

    from hydra_plugins.hydratrain_optuna_sweeper._storage import journal

    with tempfile.TemporaryDirectory(prefix="bench-hpo-") as tmp:
        cmd = [
            sys.executable, "-m", "app.train", "-m", *overrides,
            "hpo.study_name=bench", f"hpo.storage={tmp}/study.journal",
            f"hydra.sweep.dir={tmp}/multirun", f"data.cache_dir={tmp}/cache",
        ]  # fmt: skip
        started = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        wall = time.perf_counter() - started
        study = optuna.load_study(study_name="bench", storage=journal(f"{tmp}/study.journal"))
        trials = [trial_row(t) for t in sorted(study.get_trials(), key=lambda t: t.number)]
    done = [t for t in trials if t["value"] is not None and t["state"] == "COMPLETE"]
    return {
        "wall_s": wall,
        "states": {s: sum(t["state"] == s for t in trials) for s in {t["state"] for t in trials}},
        "optimizer_steps": sum(t["steps"] for t in trials),
        "best_value": min(t["value"] for t in done) if done else None,
        "trials": trials,
    }


def trial_row(t: Any) -> dict[str, Any]:
    summary = json.loads(Path(t.user_attrs["run_dir"], "summary.json").read_text())
    seconds = (t.datetime_complete - t.datetime_start).total_seconds()
    return {
        "number": t.number,
        "state": t.state.name,
        "value": t.value,
        "params": t.params,
        "steps": summary["steps"],
        "seconds": seconds,
        "train_share": summary.get("train_time_s", 0.0) / seconds,
        "eval_s": summary.get("eval_time_s"),
    }


def hpo_table(report: dict[str, Any]) -> str:
    lines = [
        "| pruner | trials (state: n) | optimizer steps | wall s | best value |",
        "|---|---|---:|---:|---:|",
    ]
    for name, s in report["studies"].items():
        states = ", ".join(f"{k.lower()}: {v}" for k, v in sorted(s["states"].items()))
        lines.append(
            f"| {name} | {states} | {s['optimizer_steps']:,} | {s['wall_s']:.0f} | "
            f"{s['best_value']:.4f} |"
        )
    short = report["short_trials"]
    lines += [
        "",
        f"pruned / unpruned optimizer steps: {report['steps_ratio']:.2f}; "
        f"same best value: {report['same_best']}",
        f"10-step trials (median of trials 2..n): {short['seconds']:.2f} s each, "
        f"{short['train_share']:.2f} of it in optimizer steps, {short['eval_s']:.2f} s "
        f"evaluating; the first trial (data, probe): {short['first_trial_s']:.2f} s",
    ]
    return "\n".join(lines)
