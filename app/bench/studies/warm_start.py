"""`python -m app.bench --warm-start`: a study warm-started from an earlier, related one, against
the same study started cold.

Pairs of the default study (`-m hpo=optuna`: its space, sampler, pruner and budget as shipped),
each first study followed by its second, run twice: cold, and warm-started from the first
(`hpo.warm_start`, `take` as given: enqueue by default, its best 5 configurations first):

- `data`: tuned on a sample of the built-in corpus (data.builtin_num_docs=2000), then on all of
  it (the default 4000 documents);
- `model`: tuned on the tiny GPT-2, then on a wider one (model.n_embd=192).

Goals per pair and seed (the warm start's issue): the warm study comes within 1 % of the cold
study's best in at most half the cold study's wall time, and ends no worse than the cold study.
Times are seconds since each study's process started. Every study of a seed shares one
micro-batch cache (the first study fills it), so none pays for probing the sizes another did.
"""

from __future__ import annotations

import tempfile
from typing import TypedDict

from app.bench.studies.hpo import Goals, StudyResult, run_study
from app.bench.studies.hpo_peers import reach_seconds

STUDY = ["hpo=optuna", "training.progress_bar=false"]
PAIRS: dict[str, tuple[list[str], list[str]]] = {
    "data": (["data.builtin_num_docs=2000"], []),
    "model": ([], ["model.n_embd=192"]),
}
TAKES = ("enqueue", "observe")


class PairRun(TypedDict):
    pair: str
    seed: int
    studies: dict[str, StudyResult]  # first, cold, warm
    goals: Goals


class WarmStartReport(TypedDict):
    take: str
    runs: list[PairRun]


def run_warm_start_bench(
    extra: list[str], seeds: list[int], pairs: list[str], take: str
) -> WarmStartReport:
    unknown = [p for p in pairs if p not in PAIRS] + ([take] if take not in TAKES else [])
    if unknown:
        raise SystemExit(f"--warm-start: {unknown[0]!r} is neither a pair nor a take")
    return {"take": take, "runs": [_pair(extra, seed, p, take) for seed in seeds for p in pairs]}


def _pair(extra: list[str], seed: int, pair: str, take: str) -> PairRun:
    first_args, second_args = PAIRS[pair]
    with tempfile.TemporaryDirectory(prefix="bench-warm-") as tmp:
        common = [*STUDY, f"hpo.seed={seed}", f"training.auto_batch.cache_dir={tmp}/autobatch"]
        common += extra
        first = run_study([*common, *first_args], keep=f"{tmp}/first.journal")
        second = [*common, *second_args]
        cold = run_study(second)
        source = f"hpo.warm_start.studies=[{{storage: {tmp}/first.journal, study_name: bench}}]"
        warm = run_study([*second, source, f"hpo.warm_start.take={take}"])
    studies = {"first": first, "cold": cold, "warm": warm}
    return {"pair": pair, "seed": seed, "studies": studies, "goals": goals(cold, warm)}


def goals(cold: StudyResult, warm: StudyResult) -> Goals:
    best = cold["best_value"]
    if best is None:
        raise SystemExit("--warm-start: the cold study completed no trial")
    reach = reach_seconds(warm, best)
    mine = warm["best_value"]
    return {
        "within_1pct_of_the_cold_best_in_half_its_wall": {
            "reach_s": reach,
            "limit_s": cold["wall_s"] / 2,
            "met": reach is not None and reach <= cold["wall_s"] / 2,
        },
        "ends_no_worse_than_the_cold_study": {
            "best": mine,
            "cold_best": best,
            "met": mine is not None and mine <= best,
        },
    }


def warm_start_table(report: WarmStartReport) -> str:
    lines = [
        f"take={report['take']}",
        "",
        "| pair | seed | study | trials (state: n) | wall s | best value | s to within 1 % "
        "of the cold best |",
        "|---|---:|---|---|---:|---:|---:|",
    ]
    for run in report["runs"]:
        cold_best = run["studies"]["cold"]["best_value"]
        for name, study in run["studies"].items():
            states = ", ".join(f"{k.lower()}: {v}" for k, v in sorted(study["states"].items()))
            reach = reach_seconds(study, cold_best) if cold_best and name != "first" else None
            lines.append(
                f"| {run['pair']} | {run['seed']} | {name} | {len(study['trials'])} ({states}) | "
                f"{study['wall_s']:.0f} | {_value(study['best_value'])} | "
                f"{'-' if reach is None else f'{reach:.0f}'} |"
            )
    lines += ["", "| pair | seed | goal | met |", "|---|---:|---|---|"]
    for run in report["runs"]:
        for goal, figures in run["goals"].items():
            lines.append(f"| {run['pair']} | {run['seed']} | {goal} | {figures['met']} |")
    return "\n".join(lines)


def _value(v: float | None) -> str:
    return "-" if v is None else f"{v:.4f}"
