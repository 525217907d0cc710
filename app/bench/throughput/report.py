"""Medians over rounds, ratios to a baseline, and the markdown tables."""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Callable, Iterable
from importlib import metadata
from typing import TypedDict


class RunResult(TypedDict, total=False):
    """One run of one arm as its worker reports it (app/bench/throughput/workers.py), or its
    `error`."""

    error: str  # a failed run has only this (and its round)
    round: int
    unit: str  # tokens | samples: what the task's throughput counts
    tokens_per_sec: float
    samples_per_sec: float
    tokens_per_step: float
    samples_per_step: int
    padding: float  # share of the computed tokens
    measured_seconds: float
    first_step_s: float | None
    peak_memory_bytes: int
    peak_memory_kind: str
    final_loss: float
    device_name: str
    dtype: str
    mfu: float | None


class Row(TypedDict, total=False):
    """An arm's medians over the rounds (`aggregate`), named by its variant and contender (the
    benchmark) or its ablation and arm, with ratios to its group's baseline (`add_ratios`).
    A row whose runs all failed has only its names, `runs_ok` 0 and the `errors`."""

    variant: str
    contender: str
    ablation: str
    arm: str
    runs_ok: int
    errors: list[str]
    unit: str
    by_round: list[float | None]  # the unit's rate per round; None: that round failed
    tokens_per_sec: float
    samples_per_sec: float
    tokens_per_sec_min: float
    tokens_per_sec_max: float
    samples_per_sec_min: float
    samples_per_sec_max: float
    padding: float | None
    peak_memory_bytes: float
    peak_memory_kind: str
    first_step_s: float | None
    final_loss: float
    mfu: float | None
    device_name: str
    dtype: str
    tokens_per_step: float
    samples_per_step: int | None
    speed_ratio: float
    memory_ratio: float
    paired_speed_ratio: float | None


class Machine(TypedDict):
    cpu: str
    cpus: int
    python: str
    torch: str | None
    transformers: str | None
    accelerate: str | None
    platform: str


class Report(TypedDict, total=False):
    """The benchmark's or the ablations' JSON report."""

    kind: str  # benchmark | ablation
    command: str
    profile: str
    rounds: int
    schedule: str  # lockstep | rounds
    warmup_steps: int
    measured_steps: int
    overrides: list[str]
    machine: Machine
    rows: list[Row]
    runs: list[dict[str, object]]  # every run of every arm, with its group and arm


def aggregate(runs: list[RunResult]) -> Row:
    """Medians over the rounds; throughput in the task's unit (tokens or samples per second:
    `unit_rate`), with its min, max and per-round figures."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"runs_ok": 0, "errors": [r["error"] for r in runs]}
    first = ok[0]
    unit = first.get("unit", "tokens")
    rates = [unit_rate(r) for r in ok]
    row: Row = {
        "runs_ok": len(ok),
        "unit": unit,
        "by_round": [unit_rate(r) if "error" not in r else None for r in runs],
        "tokens_per_sec": statistics.median(r["tokens_per_sec"] for r in ok),
        "samples_per_sec": statistics.median(r["samples_per_sec"] for r in ok),
        "peak_memory_bytes": statistics.median(r["peak_memory_bytes"] for r in ok),
        "peak_memory_kind": first["peak_memory_kind"],
        "first_step_s": median_or_none([r["first_step_s"] for r in ok]),
        "final_loss": statistics.median(r["final_loss"] for r in ok),
        "mfu": median_or_none([r.get("mfu") for r in ok]),
        "device_name": first["device_name"],
        "dtype": first["dtype"],
        "tokens_per_step": first["tokens_per_step"],
        "samples_per_step": first.get("samples_per_step"),
    }
    if unit == "samples":
        row["samples_per_sec_min"], row["samples_per_sec_max"] = min(rates), max(rates)
    else:
        row["tokens_per_sec_min"], row["tokens_per_sec_max"] = min(rates), max(rates)
    return row


def unit_rate(row: RunResult | Row) -> float:
    """A run's or row's throughput in its task's unit: tokens/s (causal LM) or samples/s."""
    return row["samples_per_sec"] if row.get("unit") == "samples" else row["tokens_per_sec"]


def _rate_range(row: Row) -> tuple[float, float]:
    if row.get("unit") == "samples":
        return row["samples_per_sec_min"], row["samples_per_sec_max"]
    return row["tokens_per_sec_min"], row["tokens_per_sec_max"]


def median_or_none(values: Iterable[float | None]) -> float | None:
    """The median of the values that are known (None: none is)."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def add_ratios(rows: list[Row], key: Callable[[Row], str], baseline: Callable[[Row], bool]) -> None:
    """Throughput (in the task's unit) and peak memory of each row relative to its group's
    baseline row."""
    bases = {key(r): r for r in rows if baseline(r) and r.get("runs_ok")}
    for row in rows:
        base = bases.get(key(row))
        if base is None or not row.get("runs_ok"):
            continue
        row["speed_ratio"] = unit_rate(row) / unit_rate(base)
        row["memory_ratio"] = row["peak_memory_bytes"] / base["peak_memory_bytes"]
        # Ratio within each round, then the median: runs next to each other in time share the
        # machine's load, so this is steadier than the ratio of medians on a shared machine.
        pairs = zip(row["by_round"], base["by_round"], strict=True)
        paired = [a / b for a, b in pairs if a is not None and b is not None]
        row["paired_speed_ratio"] = statistics.median(paired) if paired else None


# ---------------------------------------------------------------------------------------------
# Tables


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _unit(report: Report) -> str:
    return next((r["unit"] for r in report["rows"] if r.get("runs_ok")), "tokens")


def _rate_cells(r: Row) -> str:
    low, high = _rate_range(r)
    return f"{unit_rate(r):,.0f} | {low:,.0f}-{high:,.0f}"


def benchmark_table(report: Report) -> str:
    """Causal LM: tokens/s and MFU. Classification: samples/s, and the tokens behind them: those
    that carry data per second and the share of padding in what was computed."""
    samples = _unit(report) == "samples"
    tail = (
        "tokens/s | padding | first step s | final loss"
        if samples
        else "first step s | MFU | final loss"
    )
    head = (
        f"| variant | contender | {_unit(report)}/s (median) | min-max | vs bare | vs bare, paired "
        f"| peak memory MiB | vs bare | {tail} |\n"
        f"|---|---|{'---:|' * (10 if samples else 9)}"
    )
    lines = [head]
    for r in report["rows"]:
        if not r.get("runs_ok"):
            lines.append(f"| {r['variant']} | {r['contender']} | failed: {r['errors'][0]} |")
            continue
        if samples:
            last = (
                f"{r['tokens_per_sec']:,.0f} | {_fmt(r.get('padding'), '.1%')} "
                f"| {_fmt(r['first_step_s'], '.1f')} | {r['final_loss']:.3f}"
            )
        else:
            first_step = _fmt(r["first_step_s"], ".1f")
            last = f"{first_step} | {_fmt(r['mfu'], '.1%')} | {r['final_loss']:.3f}"
        lines.append(
            f"| {r['variant']} | {r['contender']} | {_rate_cells(r)} "
            f"| {_fmt(r.get('speed_ratio'), '.3f')} | {_fmt(r.get('paired_speed_ratio'), '.3f')} "
            f"| {r['peak_memory_bytes'] / 2**20:,.0f} "
            f"| {_fmt(r.get('memory_ratio'), '.3f')} | {last} |"
        )
    return _preamble(report) + "\n".join(lines)


def ablation_table(report: Report) -> str:
    head = (
        f"| option | setting | contender | {_unit(report)}/s (median) | min-max | vs first "
        "| vs first, paired | peak memory MiB |\n|---|---|---|---:|---:|---:|---:|---:|"
    )
    lines = [head]
    for r in report["rows"]:
        if not r.get("runs_ok"):
            lines.append(f"| {r['ablation']} | {r['arm']} | failed: {r['errors'][0]} |")
            continue
        lines.append(
            f"| {r['ablation']} | {r['arm']} | {r['contender']} | {_rate_cells(r)} "
            f"| {_fmt(r.get('speed_ratio'), '.3f')} | {_fmt(r.get('paired_speed_ratio'), '.3f')} "
            f"| {r['peak_memory_bytes'] / 2**20:,.0f} |"
        )
    return _preamble(report) + "\n".join(lines)


def _preamble(report: Report) -> str:
    m = report["machine"]
    none: Row = {}
    first = next((r for r in report["rows"] if r.get("runs_ok")), none)
    if first.get("unit") == "samples":
        work = (
            f"{first['samples_per_step']} samples per step "
            f"({first['tokens_per_step']:,.0f} tokens that carry data)"
        )
    else:
        work = f"{_fmt(first.get('tokens_per_step'), ',.0f')} tokens per step"
    return (
        f"profile {report['profile']}: {report['rounds']} rounds "
        f"({report.get('schedule', 'rounds')}), {report['warmup_steps']} warm-up "
        f"+ {report['measured_steps']} measured steps, {work}, "
        f"{first.get('dtype', '?')} on {first.get('device_name', '?')}\n"
        f"machine: {m['cpu']} ({m['cpus']} cores), torch {m['torch']}, "
        f"transformers {m['transformers']}, Python {m['python']}\n\n"
    )


def machine_info() -> Machine:
    from app.components.hardware.devices import _cpu_name

    def version(pkg: str) -> str | None:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return None

    return {
        "cpu": _cpu_name(),
        "cpus": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "torch": version("torch"),
        "transformers": version("transformers"),
        "accelerate": version("accelerate"),
        "platform": platform.platform(),
    }
