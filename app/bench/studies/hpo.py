"""`python -m app.bench --hpo`: what pruning saves, and where a short trial's time goes.

Pruning: the tiny CPU study (sweeps/tiny_cpu.yaml) with a random sampler, a fixed seed and a
fixed micro-batch, run once per pruner. Every study trains the same trials in the same order,
and a trial that is not pruned ends with the same value in each, so the pruned study's best can
be compared with the unpruned one's exactly. Reported per study: trials by state, optimizer
steps trained in all, wall time, the best value.

Short trials: a study of 10-step trials; the share of each trial's wall time (from the ask to
the tell of its Optuna trial) spent in optimizer steps, and the seconds spent evaluating. The
first trial of a worker also loads the data, and the first of each effective batch probes the
micro-batch: the steady state is the trials whose micro-batch came from the cache.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, NotRequired, TypedDict

from app.engine.records.summary import Summary

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

Param = float | int | str | bool | None  # a trial parameter's value (Optuna's choice types)
Params = dict[str, Param]  # by the sweeper's names (training.lr, ...)
Goals = dict[str, dict[str, object]]  # a goal's name -> its figures and `met`


class TrialRow(TypedDict):
    """A study's trial: from the sweeper's journal and the trial's summary.json, or from a
    Trainer study (app/bench/studies/hpo_peers.py), which has only the first six."""

    number: int
    state: str  # COMPLETE | PRUNED | FAIL ...
    value: float | None
    params: Params
    steps: int  # trained by this trial's job
    end: float | None  # epoch seconds
    batch_source: NotRequired[str | None]
    seconds: NotRequired[float]  # the Optuna trial's start to its end
    train_share: NotRequired[float]  # of `seconds`, in optimizer steps
    eval_s: NotRequired[float | None]
    device_seconds: NotRequired[float | None]
    curve: NotRequired[list[tuple[int, float]]]  # its reports: (step, value)


class BatchStudyFigures(TypedDict, total=False):
    """What the batch-size study leaves in optimization_results.yaml (app/studies)."""

    rows: list[dict[str, object]]
    critical_batch_curve: float | None
    curve_note: str | None
    critical_batch_noise: float | None
    target_loss: float | None


class StudyResult(TypedDict):
    wall_s: float
    started_at: float  # epoch seconds: trials' "end" are on the same clock
    cpu_s: float  # user + system seconds of the study's process: less swayed by load
    states: dict[str, int]
    optimizer_steps: int
    best_value: float | None
    trials: list[TrialRow]
    batch_size_study: NotRequired[BatchStudyFigures | None]  # where asked for
    transfer: NotRequired[dict[str, object] | None]  # optimization_results.yaml's, where asked for
    pruner_args: NotRequired[dict[str, object]]  # a Trainer study's
    reach_s: NotRequired[float | None]  # app/bench/studies/hpo_peers.py
    reach_steps: NotRequired[int | None]


class Replay(TypedDict):
    optimizer_steps: int
    best_value: float | None


class ShortTrials(TypedDict):
    train_share: float
    train_share_cached: float
    cached_trials: int
    seconds: float
    eval_s: float
    first_trial_s: float
    trials: list[TrialRow]


class HpoReport(TypedDict):
    studies: dict[str, StudyResult]
    steps_ratio: float
    same_best: bool
    replays: dict[str, Replay]
    short_trials: ShortTrials


# The study: 16 trials of up to 120 steps, evaluated every 10, on the tiny model, in the
# search space of sweeps/tiny_cpu.yaml.
STUDY = [
    "+sweeps=tiny_cpu",
    "hpo.n_trials=16",
    "hpo.sampler=random",
    "hpo.seed=7",
    "training.max_samples=null",  # steps, as measured in docs/benchmarks.md
    "training.max_steps=120",
    "training.eval_every=10",
    "training.micro_batch_size=8",
]
# The pruner each study runs with: the default of hpo=optuna (what tiny_cpu leaves), and none.
PRUNERS = {"default": [], "none": ["hpo.pruner=none"]}
# 10-step trials with the study defaults (automatic micro-batch, evaluation at the start and
# the end): the case where set-up and evaluation weigh most.
SHORT = [
    "+sweeps=tiny_cpu",
    "hpo.n_trials=12",
    "hpo.sampler=random",
    "hpo.seed=7",
    "hpo.pruner=none",
    "training.max_samples=null",
    "training.max_steps=10",
]


def run_hpo_bench(extra: list[str]) -> HpoReport:
    # The pruner goes last, so that extra overrides cannot undo an arm.
    full = run_study(STUDY + extra + PRUNERS["none"])
    pruned = run_study(STUDY + extra + PRUNERS["default"])
    short = run_study(SHORT + extra)
    later = short["trials"][1:]  # the first trial also loads the data and probes
    cached = [t for t in later if t["batch_source"] == "cached"] or later
    return {
        "studies": {"default": pruned, "none": full},
        "steps_ratio": pruned["optimizer_steps"] / full["optimizer_steps"],
        "same_best": pruned["best_value"] == full["best_value"],
        "replays": {name: replay(full["trials"], spec) for name, spec in REPLAYS.items()},
        "short_trials": {
            "train_share": statistics.median(t["train_share"] for t in later),
            "train_share_cached": statistics.median(t["train_share"] for t in cached),
            "cached_trials": len(cached),
            "seconds": statistics.median(t["seconds"] for t in later),
            "eval_s": statistics.median(t["eval_s"] or 0.0 for t in later),
            "first_trial_s": short["trials"][0]["seconds"],
            "trials": short["trials"],
        },
    }


# Pruners replayed on the unpruned study: (hpo.pruner, hpo.pruner_args). The trials of the
# unpruned study are fed in order, each stopped where the pruner would have stopped it; with one
# worker and a random sampler that is exactly the study the pruner would have run.
REPLAYS: dict[str, tuple[str, dict[str, int]]] = {
    "median (startup 4, warm-up 1 step)": ("median", {"n_startup_trials": 4, "n_warmup_steps": 1}),
    "median (default)": ("median", {}),
    "successive_halving (default)": ("successive_halving", {}),
    "successive_halving (reduction 2)": ("successive_halving", {"reduction_factor": 2}),
    "hyperband (default)": ("hyperband", {}),
}


def replay(trials: list[TrialRow], spec: tuple[str, dict[str, int]]) -> Replay:
    import optuna

    from hydra_plugins.hydratrain_optuna_sweeper.pruning import study_pruner

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    name, args = spec
    last = max(t["steps"] for t in trials)
    every = min(s for t in trials for s, _ in t["curve"] if s > 0)
    pruner = study_pruner(name, args, every, last)
    study = optuna.create_study(direction="minimize", pruner=pruner)
    steps, values = 0, []
    for t in trials:
        trial = study.ask()
        trained = t["steps"]
        for step, value in t["curve"]:
            trial.report(value, step)
            if step < t["steps"] and trial.should_prune():  # as the trainer: never at the end
                trained = step
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                break
        else:
            study.tell(trial, t["value"])
            values.append(t["value"])
        steps += trained
    done = [v for v in values if v is not None]
    return {"optimizer_steps": steps, "best_value": min(done) if done else None}


def run_study(
    overrides: list[str],
    batch_size_study: bool = False,
    keep: str | None = None,
    core: int | None = None,
    transfer: bool = False,
) -> StudyResult:
    """The study's trials as rows (those it ran: not a warm start's borrowed ones), and where
    asked, the batch-size study's analysis in its optimization_results.yaml. `keep`: a journal
    file to hold the study (study name `bench`) after the bench, for a later study to read.
    `core`: the one CPU its process and its workers run on (studies run side by side)."""
    import optuna
    import yaml
    from optuna.storages.journal import JournalFileBackend

    with tempfile.TemporaryDirectory(prefix="bench-hpo-") as tmp:
        where = keep or f"{tmp}/study.journal"
        cmd = [
            sys.executable, "-m", "app.train", "-m", *overrides,
            "hpo.study_name=bench", f"hpo.storage={where}",
            f"hydra.sweep.dir={tmp}/multirun", f"data.cache_dir={tmp}/cache",
        ]  # fmt: skip
        started, started_at = time.perf_counter(), time.time()
        code, cpu, stderr = run_child(cmd, Path(tmp, "stderr.log"), core)
        if code != 0:
            raise SystemExit(f"study failed ({code}): {' '.join(cmd)}\n{stderr[-2000:]}")
        wall = time.perf_counter() - started
        journal = optuna.storages.JournalStorage(JournalFileBackend(where))
        study = optuna.load_study(study_name="bench", storage=journal)
        ran = [t for t in study.get_trials() if t.user_attrs.get("reason") != "borrowed"]
        trials = [trial_row(t) for t in sorted(ran, key=lambda t: t.number)]
        results = yaml.safe_load(Path(tmp, "multirun", "optimization_results.yaml").read_text())
    values = [t["value"] for t in trials if t["state"] == "COMPLETE"]
    done = [v for v in values if v is not None]
    result: StudyResult = {
        "wall_s": wall,
        "started_at": started_at,
        "cpu_s": cpu,
        "states": {s: sum(t["state"] == s for t in trials) for s in {t["state"] for t in trials}},
        "optimizer_steps": sum(t["steps"] for t in trials),
        "best_value": min(done) if done else None,
        "trials": trials,
    }
    if batch_size_study:
        result["batch_size_study"] = results.get("batch_size_study")
    if transfer:  # a μP study's target (hpo.transfer): its command and its run
        result["transfer"] = results.get("transfer")
    return result


def logged(name: str, result: StudyResult) -> StudyResult:
    """Each study's result on stderr as it ends: a bench of hours keeps what it measured if it
    is stopped before its table (and a later run can take it again: `logged_studies`)."""
    print(f"{name}: {json.dumps(result, default=str)}", file=sys.stderr, flush=True)
    return result


def logged_studies(log: str, *names: re.Pattern[str]) -> dict[str, StudyResult]:
    """The studies an earlier run's stderr holds (`logged`) whose line one of `names` matches
    (group 1: the name, group 2: the result), by name; a later line wins."""
    found: dict[str, StudyResult] = {}
    for line in log.splitlines():
        for pattern in names:
            if m := pattern.match(line):
                found[m[1]] = json.loads(m[2])
                break
    return found


def run_child(cmd: list[str], stderr: Path, core: int | None = None) -> tuple[int, float, str]:
    """Run `cmd` (on `core` alone where given): its exit code, the user + system seconds of it
    and the children it waited for (its own, not those of a study running beside it), its
    stderr. Its stdout is dropped: a study's lines go to its log."""
    import os

    pinned = cmd if core is None else ["taskset", "-c", str(core), *cmd]  # util-linux
    with stderr.open("w") as err:
        proc = subprocess.Popen(pinned, stdout=subprocess.DEVNULL, stderr=err, env=fatal_env())
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime, stderr.read_text()


def children_cpu_s() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def fatal_env() -> dict[str, str]:
    """The environment of a study's process: a crash in C (an abort) says where, on stderr."""
    import os

    return {**os.environ, "PYTHONFAULTHANDLER": "1", "LIBC_FATAL_STDERR_": "1"}


def trial_row(t: FrozenTrial) -> TrialRow:
    summary = Summary.read(t.user_attrs["run_dir"])
    assert t.datetime_start is not None and t.datetime_complete is not None  # a finished trial
    seconds = (t.datetime_complete - t.datetime_start).total_seconds()
    return {
        "number": t.number,
        "state": t.state.name,
        "value": t.value,
        "params": t.params,
        "steps": summary.steps - summary.resumed_from_step,  # trained by this trial's job
        "end": t.datetime_complete.timestamp(),
        "batch_source": summary.batch_source,
        "seconds": seconds,
        "train_share": summary.train_time_s / seconds,
        "eval_s": summary.eval_time_s,
        "device_seconds": summary.device_seconds,
        "curve": sorted(t.intermediate_values.items()),
    }


def hpo_table(report: HpoReport) -> str:
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
    full = report["studies"]["none"]
    lines += [
        "",
        "| pruner replayed on the unpruned study | optimizer steps | share | best value |",
        "|---|---:|---:|---:|",
    ]
    for name, r in report["replays"].items():
        share = r["optimizer_steps"] / full["optimizer_steps"]
        lines.append(f"| {name} | {r['optimizer_steps']:,} | {share:.2f} | {r['best_value']:.4f} |")
    short = report["short_trials"]
    lines += [
        "",
        f"pruned / unpruned optimizer steps: {report['steps_ratio']:.2f}; "
        f"same best value: {report['same_best']}",
        f"10-step trials (median of trials 2..n): {short['seconds']:.2f} s each, "
        f"{short['train_share']:.2f} of it in optimizer steps ({short['train_share_cached']:.2f} "
        f"in the {short['cached_trials']} trials with a cached micro-batch), "
        f"{short['eval_s']:.2f} s evaluating; the first trial (data, probe): "
        f"{short['first_trial_s']:.2f} s",
    ]
    return "\n".join(lines)
