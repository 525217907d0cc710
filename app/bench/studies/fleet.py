"""`python -m app.bench --fleet`: the same seeded CPU study run by 1 and by 2 workers.

The study: the tiny model on the built-in corpus, a random sampler with a fixed seed, no
pruner, a fixed micro-batch and effective batch, and a search space that changes no trial's
cost (learning rate and weight decay), so every trial trains the same number of samples and
the arms differ only in how many workers share the study. Each worker uses one thread
(OMP_NUM_THREADS=1) and no data-loader process; 2 workers on a 2-core machine can at best
double the throughput.

Reported per arm: wall time of the whole command (start-up of the parent and its workers
included), trials per hour over that wall time, trials per hour over the span of the trials
themselves (first start to last end: the steady state a long study approaches), the median
trial time, and where the rest of the wall time goes: the seconds from the command's start to
its first trial's start (start-up), and from its last trial's end to the command's end (the
ending: results, report, exits). Ratios are to the 1-worker arm of the same run. Arms
alternate when `--rounds` > 1 (medians reported), so a shared machine's drift hits both alike.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING, NotRequired, TypedDict

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

STUDY = [
    "+sweeps=tiny_cpu",
    "hpo.n_trials=16",
    "hpo.sampler=random",
    "hpo.seed=7",
    "hpo.pruner=none",
    "hpo.tensorboard=false",
    "training.max_samples=null",  # steps, as measured in docs/benchmarks.md
    "training.max_steps=60",
    "training.eval_every=30",
    "training.effective_batch_size=16",
    "training.micro_batch_size=16",
    "data.num_workers=0",  # the worker is one process on one core: no data-loader process
    "hydra.sweeper.params={training.lr:'tag(log, interval(3e-4, 3e-2))',"
    "training.weight_decay:'interval(0.0, 0.2)'}",
]


class StudyRun(TypedDict):
    """One study by `workers` workers."""

    workers: int
    trials: int  # completed
    wall_s: float  # the whole command
    span_s: float  # first trial's start to last trial's end
    start_s: float  # the command's start to its first trial's start
    end_s: float  # its last trial's end to the command's end
    median_trial_s: float
    trials_by_worker: dict[str, int]


class ArmMedians(StudyRun):
    """An arm's medians over its rounds, and its trials per hour against the first arm's."""

    trials_per_hour_wall: float
    trials_per_hour_span: float
    ratio_wall: NotRequired[float]  # with_ratios
    ratio_span: NotRequired[float]


class FleetReport(TypedDict):
    study: list[str]
    rounds: int
    arms: dict[int, ArmMedians]
    runs: dict[int, list[StudyRun]]


def run_fleet_bench(
    extra: list[str], rounds: int = 1, workers: tuple[int, ...] = (1, 2)
) -> FleetReport:
    runs: dict[int, list[StudyRun]] = {n: [] for n in workers}
    for _ in range(rounds):
        for n in workers:
            runs[n].append(run_arm(n, extra))
    arms = with_ratios({n: summarize(rs) for n, rs in runs.items()})
    return {"study": STUDY + extra, "rounds": rounds, "arms": arms, "runs": runs}


def with_ratios(arms: dict[int, ArmMedians]) -> dict[int, ArmMedians]:
    """Each arm's trials per hour over the first arm's (1 worker), measured in the same run."""
    base = next(iter(arms.values()))
    for arm in arms.values():
        arm["ratio_wall"] = arm["trials_per_hour_wall"] / base["trials_per_hour_wall"]
        arm["ratio_span"] = arm["trials_per_hour_span"] / base["trials_per_hour_span"]
    return arms


def run_arm(workers: int, extra: list[str]) -> StudyRun:
    """One study with `workers` workers, in a fresh storage and data cache."""
    import optuna
    from optuna.storages.journal import JournalFileBackend

    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        cmd = [
            sys.executable, "-m", "app.train", "-m", *STUDY, *extra,
            f"hpo.workers={workers}", "hpo.study_name=bench", f"hpo.storage={tmp}/study.journal",
            f"hydra.sweep.dir={tmp}/multirun", f"data.cache_dir={tmp}/cache",
        ]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        began = time.time()  # the trials' datetimes are wall-clock times too
        started = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - started
        if proc.returncode != 0:
            tail = proc.stderr[-2000:]
            raise SystemExit(f"study failed ({proc.returncode}): {' '.join(cmd)}\n{tail}")
        journal = optuna.storages.JournalStorage(JournalFileBackend(f"{tmp}/study.journal"))
        trials = optuna.load_study(study_name="bench", storage=journal).get_trials()
    done = [t for t in trials if t.state.name == "COMPLETE"]
    windows = [(t.datetime_start, t.datetime_complete) for t in done]
    starts = [s.timestamp() for s, _ in windows if s is not None]
    ends = [e.timestamp() for _, e in windows if e is not None]
    span = max(ends) - min(starts)
    seconds = [e.timestamp() - s.timestamp() for s, e in windows if s and e]
    return {
        "workers": workers,
        "trials": len(done),
        "wall_s": wall,
        "span_s": span,
        "start_s": min(starts) - began,
        "end_s": began + wall - max(ends),
        "median_trial_s": statistics.median(seconds),
        "trials_by_worker": _by_worker(done),
    }


def _by_worker(trials: list[FrozenTrial]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in trials:
        worker = t.user_attrs.get("worker")  # a lone worker records none
        key = "lone" if worker is None else str(worker)
        counts[key] = counts.get(key, 0) + 1
    return counts


def summarize(runs: list[StudyRun]) -> ArmMedians:
    wall = statistics.median(r["wall_s"] for r in runs)
    span = statistics.median(r["span_s"] for r in runs)
    trials = runs[0]["trials"]
    return {
        "workers": runs[0]["workers"],
        "trials": trials,
        "wall_s": wall,
        "span_s": span,
        "start_s": statistics.median(r["start_s"] for r in runs),
        "end_s": statistics.median(r["end_s"] for r in runs),
        "trials_per_hour_wall": trials * 3600 / wall,
        "trials_per_hour_span": trials * 3600 / span,
        "median_trial_s": statistics.median(r["median_trial_s"] for r in runs),
        "trials_by_worker": runs[-1]["trials_by_worker"],
    }


def fleet_table(report: FleetReport) -> str:
    lines = [
        "| workers | trials | wall s | trials/h (wall) | ratio | trials/h (trial span) | ratio "
        "| median trial s | start-up s | ending s | trials per worker |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for a in report["arms"].values():
        per = ", ".join(f"{k}: {v}" for k, v in sorted(a["trials_by_worker"].items()))
        lines.append(
            f"| {a['workers']} | {a['trials']} | {a['wall_s']:.1f} | "
            f"{a['trials_per_hour_wall']:.0f} | {a['ratio_wall']:.2f}x | "
            f"{a['trials_per_hour_span']:.0f} | {a['ratio_span']:.2f}x | "
            f"{a['median_trial_s']:.2f} | {a['start_s']:.1f} | {a['end_s']:.1f} | {per} |"
        )
    lines.append(f"\nmedians over {report['rounds']} round(s); arms alternate within a round")
    return "\n".join(lines)
