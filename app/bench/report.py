"""Medians over rounds, ratios to a baseline, and the markdown tables."""

from __future__ import annotations

import os
import platform
import statistics
from importlib import metadata
from typing import Any


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the rounds; throughput in the task's unit (tokens or samples per second:
    `unit_rate`), with its min, max and per-round figures."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"runs_ok": 0, "errors": [r["error"] for r in runs]}
    first = ok[0]
    unit = first.get("unit", "tokens")
    rate = f"{unit}_per_sec"
    rates = [r[rate] for r in ok]
    return {
        "runs_ok": len(ok),
        "unit": unit,
        "by_round": [r.get(rate) for r in runs],  # None: that round failed
        "tokens_per_sec": statistics.median(r["tokens_per_sec"] for r in ok),
        "samples_per_sec": statistics.median(r["samples_per_sec"] for r in ok),
        f"{rate}_min": min(rates),
        f"{rate}_max": max(rates),
        "padding": _median_or_none([r.get("padding") for r in ok]),
        "peak_memory_bytes": statistics.median(r["peak_memory_bytes"] for r in ok),
        "peak_memory_kind": first["peak_memory_kind"],
        "first_step_s": statistics.median(r["first_step_s"] for r in ok),
        "final_loss": statistics.median(r["final_loss"] for r in ok),
        "mfu": _median_or_none([r.get("mfu") for r in ok]),
        "device_name": first["device_name"],
        "dtype": first["dtype"],
        "tokens_per_step": first["tokens_per_step"],
        "samples_per_step": first.get("samples_per_step"),
    }


def unit_rate(row: dict[str, Any]) -> float:
    """A row's throughput in its task's unit: tokens/s (causal LM) or samples/s."""
    return row[f"{row.get('unit', 'tokens')}_per_sec"]


def _median_or_none(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def add_ratios(rows: list[dict[str, Any]], key, baseline) -> None:
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


def _unit(report: dict[str, Any]) -> str:
    return next((r["unit"] for r in report["rows"] if r.get("runs_ok")), "tokens")


def _rate_cells(r: dict[str, Any]) -> str:
    rate = f"{r['unit']}_per_sec"
    return f"{r[rate]:,.0f} | {r[rate + '_min']:,.0f}-{r[rate + '_max']:,.0f}"


def benchmark_table(report: dict[str, Any]) -> str:
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
                f"| {r['first_step_s']:.1f} | {r['final_loss']:.3f}"
            )
        else:
            last = f"{r['first_step_s']:.1f} | {_fmt(r['mfu'], '.1%')} | {r['final_loss']:.3f}"
        lines.append(
            f"| {r['variant']} | {r['contender']} | {_rate_cells(r)} "
            f"| {_fmt(r.get('speed_ratio'), '.3f')} | {_fmt(r.get('paired_speed_ratio'), '.3f')} "
            f"| {r['peak_memory_bytes'] / 2**20:,.0f} "
            f"| {_fmt(r.get('memory_ratio'), '.3f')} | {last} |"
        )
    return _preamble(report) + "\n".join(lines)


def ablation_table(report: dict[str, Any]) -> str:
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


def _preamble(report: dict[str, Any]) -> str:
    m = report["machine"]
    first: dict[str, Any] = next((r for r in report["rows"] if r.get("runs_ok")), {})
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


def machine_info() -> dict[str, Any]:
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
