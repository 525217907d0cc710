"""Running the suite and reading it: every contender on every benchmark and seed, each study
in turn (one at a time: the walls compare), each line of results kept as it ends (a partial
JSONL file, so a long run that stops keeps what it measured); medians and means over seeds
after 1/6, 1/3, 2/3 and all of the compute; a table, and a plot of the median regret."""

from __future__ import annotations

import json
import statistics
import time
import traceback
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path
from typing import TypedDict

from app.bench.studies.mf.hartmann import MAX_FIDELITY, SUITE, benchmark
from app.bench.studies.mf.peers import PEERS, Run
from app.bench.studies.mf.protocol import BUDGET_TRIALS, FRACTIONS, Ledger, regret_curve
from app.bench.studies.mf.sweeper import VARIANTS, hydratrain

OURS = "hydratrain-default"
# This sweeper's default study and the peers run by default; its other options on request
CONTENDERS: dict[str, tuple[Run, str]] = {OURS: (hydratrain("default"), "optuna"), **PEERS}
OPTIONS: dict[str, tuple[Run, str]] = {
    f"hydratrain-{v}": (hydratrain(v), "optuna") for v in VARIANTS if v != "default"
}
EVERY_CONTENDER = {**CONTENDERS, **OPTIONS}
SEEDS = tuple(range(8))


class Study(TypedDict):
    """One contender's study of one benchmark and seed."""

    benchmark: str
    contender: str
    seed: int
    regret: list[float | None]  # after each of FRACTIONS of the compute
    wall_s: float
    spent: int
    evaluations: int
    error: str | None  # why it did not run (not installed, failed)


class MfReport(TypedDict):
    versions: dict[str, str]
    budget: int
    studies: list[Study]


def run_mf_bench(
    benchmarks: list[str],
    contenders: list[str],
    seeds: list[int],
    partial: Path,
    runs: Mapping[str, tuple[Run, str]] = EVERY_CONTENDER,
) -> MfReport:
    """Each (benchmark, seed, contender) study in turn; what `partial` already holds (an
    earlier run of the same command, stopped) is kept, not run again."""
    done = {_key(s): s for s in _read(partial)}
    studies = []
    for name in benchmarks:
        bench = benchmark(name)
        for seed in seeds:
            for who in contenders:
                key = (name, who, seed)
                if key not in done:
                    done[key] = _study(bench.name, who, seed, runs[who][0])
                    with partial.open("a") as f:
                        f.write(json.dumps(done[key]) + "\n")
                studies.append(done[key])
    return {"versions": versions(contenders, runs), "budget": _budget(), "studies": studies}


def _budget() -> int:
    return BUDGET_TRIALS * MAX_FIDELITY


def _study(name: str, who: str, seed: int, run: Run) -> Study:
    ledger = Ledger(benchmark(name), _budget())
    started = time.perf_counter()
    error = None
    try:
        run(ledger, seed)
    except ImportError as e:
        error = f"not installed: {e}"
    except Exception as e:  # a peer's failure is a row of the table, not the end of the run
        error = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    wall = time.perf_counter() - started
    print(f"{name} {who} seed {seed}: {wall:.1f} s, {ledger.spent} spent", flush=True)
    return {
        "benchmark": name,
        "contender": who,
        "seed": seed,
        "regret": regret_curve(ledger) if error is None else [None] * len(FRACTIONS),
        "wall_s": wall,
        "spent": ledger.spent,
        "evaluations": len(ledger.evaluations),
        "error": error,
    }


def _key(s: Study) -> tuple[str, str, int]:
    return (s["benchmark"], s["contender"], s["seed"])


def _read(path: Path) -> list[Study]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def versions(contenders: list[str], runs: Mapping[str, tuple[Run, str]]) -> dict[str, str]:
    """The installed version of each contender's package (and the benchmark's numpy)."""
    out = {}
    for package in sorted({runs[c][1] for c in contenders} | {"numpy"}):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = "not installed"
    return out


# -- reading it ----------------------------------------------------------------------------------


class Summary(TypedDict):
    median: list[float | None]  # over seeds, after each of FRACTIONS
    mean: list[float | None]
    wall_s: float  # median
    seeds: int  # that ran


def summaries(report: MfReport) -> dict[str, dict[str, Summary]]:
    """benchmark -> contender -> the figures over its seeds."""
    groups: dict[str, dict[str, list[Study]]] = {}
    for s in report["studies"]:
        if s["error"] is None:
            groups.setdefault(s["benchmark"], {}).setdefault(s["contender"], []).append(s)
    return {b: {c: _summary(studies) for c, studies in by.items()} for b, by in groups.items()}


def _summary(studies: list[Study]) -> Summary:
    def over(i: int, stat: Callable[[list[float]], float]) -> float | None:
        values = [r for s in studies if (r := s["regret"][i]) is not None]
        return stat(values) if len(values) == len(studies) else None

    n = len(FRACTIONS)
    return {
        "median": [over(i, statistics.median) for i in range(n)],
        "mean": [over(i, statistics.fmean) for i in range(n)],
        "wall_s": statistics.median(s["wall_s"] for s in studies),
        "seeds": len(studies),
    }


def suite_means(report: MfReport) -> dict[str, float]:
    """Each contender's mean final regret over every benchmark and seed it ran."""
    by: dict[str, list[float]] = {}
    for s in report["studies"]:
        final = s["regret"][-1]
        if s["error"] is None and final is not None:
            by.setdefault(s["contender"], []).append(final)
    return {c: statistics.fmean(v) for c, v in by.items()}


def mf_table(report: MfReport) -> str:
    shown = ", ".join(f"{k} {v}" for k, v in report["versions"].items())
    lines = [
        f"versions: {shown}; budget {report['budget']:,} fidelity units "
        f"({BUDGET_TRIALS} full trials' worth) per study",
        "",
        "| benchmark | contender | seeds | median regret at 1/6, 1/3, 2/3, all of the compute "
        "| mean regret, same | median wall s |",
        "|---|---|---:|---|---|---:|",
    ]
    for b, by in summaries(report).items():
        best = min(
            (s["median"][-1] for s in by.values() if s["median"][-1] is not None), default=None
        )
        for c, s in sorted(by.items(), key=lambda kv: _final(kv[1])):
            name = f"**{c}**" if s["median"][-1] == best else c
            lines.append(
                f"| {b} | {name} | {s['seeds']} | {_row(s['median'])} | {_row(s['mean'])} | "
                f"{s['wall_s']:.1f} |"
            )
    lines += ["", "| contender | mean final regret over the suite |", "|---|---:|"]
    for c, m in sorted(suite_means(report).items(), key=lambda kv: kv[1]):
        lines.append(f"| {c} | {m:.4f} |")
    errors = {(s["contender"], s["error"]) for s in report["studies"] if s["error"]}
    lines += [f"\nnot run: {c}: {e}" for c, e in sorted(errors)]
    return "\n".join(lines)


def _final(s: Summary) -> float:
    final = s["median"][-1]
    return float("inf") if final is None else final


def _row(values: list[float | None]) -> str:
    return ", ".join("n/a" if v is None else f"{v:.4f}" for v in values)


def plot_mf(report: MfReport, path: Path) -> None:
    """The median regret after each fraction of the compute, one panel per benchmark."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_bench = summaries(report)
    fig, axes = plt.subplots(1, len(by_bench), figsize=(4.2 * len(by_bench), 4), squeeze=False)
    xs = [float(f) for f in FRACTIONS]
    for ax, (b, by) in zip(axes[0], by_bench.items(), strict=True):
        for c, s in by.items():
            ys = [float("nan") if v is None else max(v, 1e-6) for v in s["median"]]
            ax.plot(xs, ys, marker="o", label=c, linewidth=2.5 if c == OURS else 1.2)
        ax.set(title=b, xlabel="share of the compute", ylabel="median regret", yscale="log")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


DEFAULT_BENCHMARKS = list(SUITE)
