"""`python -m app.bench --report`: how long a study's report takes for a study of 200 trials.

The study is synthetic and seeded, written to an Optuna journal as this sweeper records its
trials (every ending: complete, pruned, paused, out of memory, failed; two workers on their own
devices; 11 reports each; four parameters), so the figures are as costly as a real study's.
Timed: the whole command `python -m app.report` (interpreter and imports included: what a
user waits for), the report written in a process that has already written one (what a sweep's
end adds when its imports are warm), and, as the baseline of the same run, the interpreter
importing what the report imports.
"""

from __future__ import annotations

import datetime as dt
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution
    from optuna.trial import FrozenTrial

TRIALS = 200
ENDINGS = [("complete", 0.3), ("pruned", 0.35), ("paused", 0.25), ("oom", 0.05), ("error", 0.05)]
IMPORTS = "import optuna, plotly.graph_objects, matplotlib.pyplot, optuna.visualization"


class ReportTimes(TypedDict):
    trials: int
    rounds: int
    whole_command_s: list[float]  # python -m app.report, one a round
    imports_baseline_s: list[float]  # the interpreter importing the report's libraries
    in_process_s: list[float]  # the report again in a warm process
    report_bytes: int


def run_report_bench(rounds: int = 5, trials: int = TRIALS) -> ReportTimes:
    with tempfile.TemporaryDirectory() as tmp:
        journal = str(Path(tmp, "study.journal"))
        write_study(journal, trials)
        command = [sys.executable, "-m", "app.report", "--storage", journal, "--out", tmp]
        whole = [_timed(command) for _ in range(rounds)]
        baseline = [_timed([sys.executable, "-c", IMPORTS]) for _ in range(rounds)]
        warm = _in_process(journal, tmp, rounds)
        size = Path(tmp, "report.html").stat().st_size
    return {
        "trials": trials,
        "rounds": rounds,
        "whole_command_s": whole,
        "imports_baseline_s": baseline,
        "in_process_s": warm,
        "report_bytes": size,
    }


def _timed(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - start


def _in_process(journal: str, out: str, rounds: int) -> list[float]:
    from hydra_plugins.hydratrain_optuna_sweeper.report import write_study_report

    write_study_report(journal, None, out)  # imports and first-use costs
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        write_study_report(journal, None, out)
        times.append(time.perf_counter() - start)
    return times


def write_study(journal: str, n: int, seed: int = 0) -> None:
    """A seeded study with the trials' attributes as the sweeper records them."""
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rng = random.Random(seed)
    study = optuna.create_study(
        study_name="bench", storage=JournalStorage(JournalFileBackend(journal))
    )
    space = {
        "training.lr": FloatDistribution(1e-4, 1e-2, log=True),
        "training.weight_decay": FloatDistribution(0.0, 0.2),
        "training.effective_batch_size": CategoricalDistribution([8, 16, 32, 64]),
        "training.warmup_steps": IntDistribution(0, 50),
    }
    start = dt.datetime(2026, 1, 1)
    trials = [_trial(i, rng, space, start + dt.timedelta(seconds=30 * i)) for i in range(n)]
    study.add_trials(trials)


def _trial(
    i: int, rng: random.Random, space: dict[str, BaseDistribution], begun: dt.datetime
) -> FrozenTrial:
    from optuna.trial import TrialState, create_trial

    ending = rng.choices([e for e, _ in ENDINGS], [w for _, w in ENDINGS])[0]
    lr = 10 ** rng.uniform(-4, -2)
    params = {
        "training.lr": lr,
        "training.weight_decay": rng.uniform(0.0, 0.2),
        "training.effective_batch_size": rng.choice([8, 16, 32, 64]),
        "training.warmup_steps": rng.randint(0, 50),
    }
    last = {"complete": 100, "pruned": 30, "paused": 30, "oom": -1, "error": 40}[ending]
    curve = {s: 2 + abs(lr - 3e-3) * 100 + 3 / (1 + s / 10) for s in range(0, last + 1, 10)}
    state = {"complete": TrialState.COMPLETE, "error": TrialState.FAIL}.get(ending)
    trial = create_trial(
        state=state or TrialState.PRUNED,
        value=None if ending == "error" or not curve else curve[max(curve)],
        params=params,
        distributions=space,
        intermediate_values=curve,
        user_attrs={
            **({"reason": ending} if ending != "complete" else {}),
            "worker": i % 2,
            "devices": str(i % 2),
            "device_seconds": 0.3 * max(last, 0),
            "micro_batch_size": 8,
            "grad_accum_steps": params["training.effective_batch_size"] // 8,
            "batch_source": "cached",
        },
    )
    trial.datetime_start = begun
    trial.datetime_complete = begun + dt.timedelta(seconds=0.25 * max(last, 1))
    return trial


def report_bench_table(report: ReportTimes) -> str:
    rows = [
        ("`python -m app.report` (whole command)", report["whole_command_s"]),
        ("the report in a warm process (a sweep's end)", report["in_process_s"]),
        ("baseline: the interpreter importing its libraries", report["imports_baseline_s"]),
    ]
    base = statistics.median(report["imports_baseline_s"])
    lines = ["| what | median s | min s | vs baseline |", "|---|---:|---:|---:|"]
    for name, times in rows:
        median = statistics.median(times)
        lines.append(f"| {name} | {median:.2f} | {min(times):.2f} | {median / base:.2f}x |")
    lines.append(
        f"\n{report['trials']} trials, {report['rounds']} rounds; "
        f"report.html {report['report_bytes'] / 2**20:.1f} MiB"
    )
    return "\n".join(lines)
