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
A study two pairs need is run once (the data pair's cold study is the model pair's first).
`--cores 0,1`: studies side by side, each pinned to one of these CPUs (run it with
OMP_NUM_THREADS=1), a free core taking the next study whose source has finished; `--pairs
model,data` starts the longest study first.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from typing import TypedDict

from app.bench.studies.hpo import Goals, StudyResult, run_study
from app.bench.studies.hpo_peers import reach_seconds
from app.bench.studies.lanes import Task, run_on_cores

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
    cores: list[int] | None  # the CPUs studies ran on side by side, one each; None: one by one
    runs: list[PairRun]


@dataclass
class Job:
    """One study of a seed's plan: `source` names the job whose journal it starts from."""

    overrides: list[str]
    journal: str
    source: str | None = None
    result: StudyResult | None = None


def run_warm_start_bench(
    extra: list[str], seeds: list[int], pairs: list[str], take: str, cores: list[int] | None
) -> WarmStartReport:
    unknown = [p for p in pairs if p not in PAIRS] + ([take] if take not in TAKES else [])
    if unknown:
        raise SystemExit(f"--warm-start: {unknown[0]!r} is neither a pair nor a take")
    runs = [run for seed in seeds for run in _seed(extra, seed, pairs, take, cores)]
    return {"take": take, "cores": cores, "runs": runs}


def _seed(
    extra: list[str], seed: int, pairs: list[str], take: str, cores: list[int] | None
) -> list[PairRun]:
    with tempfile.TemporaryDirectory(prefix="bench-warm-") as tmp:
        common = [*STUDY, f"hpo.seed={seed}", f"training.auto_batch.cache_dir={tmp}/autobatch"]
        jobs = plan(pairs, [*common, *extra], take, tmp)
        run_jobs(jobs, cores)
    runs: list[PairRun] = []
    for pair in pairs:
        first, second = (_name(args) for args in PAIRS[pair])
        studies = {k: _done(jobs[n]) for k, n in (("first", first), ("cold", second))}
        studies["warm"] = _done(jobs[f"{second} <- {first}"])
        goal = goals(studies["cold"], studies["warm"])
        runs.append({"pair": pair, "seed": seed, "studies": studies, "goals": goal})
    return runs


def plan(pairs: list[str], common: list[str], take: str, tmp: str) -> dict[str, Job]:
    """Every study the pairs need, each once (the data pair's cold study is the model pair's
    first: the default study), by name: the cold ones in the pairs' order, then the warm ones."""
    jobs: dict[str, Job] = {}
    for pair in pairs:
        for args in PAIRS[pair]:
            jobs.setdefault(_name(args), Job([*common, *args], f"{tmp}/{len(jobs)}.journal"))
    for pair in pairs:
        second_args, first = PAIRS[pair][1], _name(PAIRS[pair][0])
        source = f"hpo.warm_start.studies=[{{storage: {jobs[first].journal}, study_name: bench}}]"
        warm = [*common, *second_args, source, f"hpo.warm_start.take={take}"]
        name = f"{_name(second_args)} <- {first}"
        jobs[name] = Job(warm, f"{tmp}/{len(jobs)}.journal", source=first)
    return jobs


def run_jobs(jobs: dict[str, Job], cores: list[int] | None) -> None:
    """Every job, each warm one after its source (app/bench/studies/lanes.py)."""

    def task(job: Job) -> Task[StudyResult]:
        return Task(lambda core: run_study(job.overrides, keep=job.journal, core=core), job.source)

    results = run_on_cores({name: task(job) for name, job in jobs.items()}, cores)
    for name, job in jobs.items():
        job.result = results[name]


def _done(job: Job) -> StudyResult:
    assert job.result is not None
    return job.result


def _name(args: list[str]) -> str:
    return " ".join(args) or "default"


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
