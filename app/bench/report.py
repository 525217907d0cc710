"""Medians over rounds, ratios to a baseline, and the markdown tables."""

from __future__ import annotations

import os
import platform
import statistics
from importlib import metadata
from typing import Any


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"runs_ok": 0, "errors": [r["error"] for r in runs]}
    tps = [r["tokens_per_sec"] for r in ok]
    first = ok[0]
    return {
        "runs_ok": len(ok),
        "by_round": [r.get("tokens_per_sec") for r in runs],  # None: that round failed
        "tokens_per_sec": statistics.median(tps),
        "tokens_per_sec_min": min(tps),
        "tokens_per_sec_max": max(tps),
        "samples_per_sec": statistics.median(r["samples_per_sec"] for r in ok),
        "peak_memory_bytes": statistics.median(r["peak_memory_bytes"] for r in ok),
        "peak_memory_kind": first["peak_memory_kind"],
        "first_step_s": statistics.median(r["first_step_s"] for r in ok),
        "final_loss": statistics.median(r["final_loss"] for r in ok),
        "mfu": _median_or_none([r.get("mfu") for r in ok]),
        "device_name": first["device_name"],
        "dtype": first["dtype"],
        "tokens_per_step": first["tokens_per_step"],
    }


def _median_or_none(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def add_ratios(rows: list[dict[str, Any]], key, baseline) -> None:
    """tokens/s and peak memory of each row relative to its group's baseline row."""
    bases = {key(r): r for r in rows if baseline(r) and r.get("runs_ok")}
    for row in rows:
        base = bases.get(key(row))
        if base is None or not row.get("runs_ok"):
            continue
        row["speed_ratio"] = row["tokens_per_sec"] / base["tokens_per_sec"]
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


def benchmark_table(report: dict[str, Any]) -> str:
    head = (
        "| variant | contender | tokens/s (median) | min-max | vs bare | vs bare, paired "
        "| peak memory MiB | vs bare | first step s | MFU | final loss |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    lines = [head]
    for r in report["rows"]:
        if not r.get("runs_ok"):
            lines.append(f"| {r['variant']} | {r['contender']} | failed: {r['errors'][0]} |")
            continue
        lines.append(
            f"| {r['variant']} | {r['contender']} | {r['tokens_per_sec']:,.0f} "
            f"| {r['tokens_per_sec_min']:,.0f}-{r['tokens_per_sec_max']:,.0f} "
            f"| {_fmt(r.get('speed_ratio'), '.3f')} | {_fmt(r.get('paired_speed_ratio'), '.3f')} "
            f"| {r['peak_memory_bytes'] / 2**20:,.0f} "
            f"| {_fmt(r.get('memory_ratio'), '.3f')} | {r['first_step_s']:.1f} "
            f"| {_fmt(r['mfu'], '.1%')} | {r['final_loss']:.3f} |"
        )
    return _preamble(report) + "\n".join(lines)


def ablation_table(report: dict[str, Any]) -> str:
    head = (
        "| option | setting | contender | tokens/s (median) | min-max | vs first "
        "| vs first, paired | peak memory MiB |\n|---|---|---|---:|---:|---:|---:|---:|"
    )
    lines = [head]
    for r in report["rows"]:
        if not r.get("runs_ok"):
            lines.append(f"| {r['ablation']} | {r['arm']} | failed: {r['errors'][0]} |")
            continue
        lines.append(
            f"| {r['ablation']} | {r['arm']} | {r['contender']} | {r['tokens_per_sec']:,.0f} "
            f"| {r['tokens_per_sec_min']:,.0f}-{r['tokens_per_sec_max']:,.0f} "
            f"| {_fmt(r.get('speed_ratio'), '.3f')} | {_fmt(r.get('paired_speed_ratio'), '.3f')} "
            f"| {r['peak_memory_bytes'] / 2**20:,.0f} |"
        )
    return _preamble(report) + "\n".join(lines)


def _preamble(report: dict[str, Any]) -> str:
    m = report["machine"]
    first = next((r for r in report["rows"] if r.get("runs_ok")), {})
    return (
        f"profile {report['profile']}: {report['rounds']} rounds "
        f"({report.get('schedule', 'rounds')}), {report['warmup_steps']} warm-up "
        f"+ {report['measured_steps']} measured steps, {first.get('tokens_per_step', '?')} tokens "
        f"per step, {first.get('dtype', '?')} on {first.get('device_name', '?')}\n"
        f"machine: {m['cpu']} ({m['cpus']} cores), torch {m['torch']}, "
        f"transformers {m['transformers']}, Python {m['python']}\n\n"
    )


def machine_info() -> dict[str, Any]:
    from app.hardware.devices import _cpu_name

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
