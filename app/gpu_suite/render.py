"""DIR/report.md: the header, a table of the steps, then each step's commands, figures,
checks and, where one failed, its last lines of output."""

from __future__ import annotations

import json

from app.gpu_suite.report import CommandRecord, Report, StepRecord

HEADER_ROWS = (
    ("mode", "mode"),
    ("device", "device"),
    ("GPUs", "gpus"),
    ("driver", "driver"),
    ("torch", "torch"),
    ("CUDA", "cuda"),
    ("Python", "python"),
    ("git commit", "git_commit"),
    ("missing Python modules", "missing_modules"),
    ("dependencies", "dependencies"),
    ("commands run from", "cwd"),
    ("updated", "updated"),
)


def markdown(report: Report) -> str:
    lines = ["# GPU suite report", "", "| | |", "|---|---|"]
    lines += [f"| {label} | {_cell(report.header.get(key))} |" for label, key in HEADER_ROWS]
    lines += ["", *_parts(report), "## Steps", "", *_summary(report)]
    for rec in report.steps:
        lines += ["", *_step(rec)]
    return "\n".join(lines) + "\n"


def _parts(report: Report) -> list[str]:
    if not report.parts:
        return []
    rows = [
        f"- {p.get('started')}: `{p.get('command')}` on {p.get('device')}" for p in report.parts
    ]
    return ["Parts run into this directory:", "", *rows, ""]


def _summary(report: Report) -> list[str]:
    rows = ["| # | step | status | seconds | limit s | reason |", "|---:|---|---|---:|---:|---|"]
    for s in report.steps:
        rows.append(
            f"| {s.number} | {s.name} | {_status(s.status)} | {s.seconds:.1f} | "
            f"{s.limit_s:.0f} | {_cell(s.reason or '')} |"
        )
    return rows


def _step(rec: StepRecord) -> list[str]:
    lines = [f"### {rec.number}. {rec.name}: {rec.title}", ""]
    lines.append(f"**{_status(rec.status)}**" + (f": {rec.reason}" if rec.reason else ""))
    lines += ["", f"{rec.seconds:.1f} s of a {rec.limit_s:.0f} s limit; device: {rec.device}", ""]
    for cmd in rec.commands:
        lines += _command(cmd)
    if rec.figures:
        lines += ["", "| figure | value |", "|---|---|"]
        lines += [f"| {k} | {_cell(v)} |" for k, v in rec.figures.items()]
    if rec.checks:
        lines.append("")
        for c in rec.checks:
            mark = "x" if c.ok else " "
            kind = "goal" if c.goal else "check"
            lines.append(f"- [{mark}] {kind}: {c.name}" + (f" ({c.detail})" if c.detail else ""))
    if rec.tail:
        lines += ["", "Last lines:", "", "```", *rec.tail, "```"]
    return lines


def _command(cmd: CommandRecord) -> list[str]:
    state = cmd.status if cmd.rc is None else f"{cmd.status}, rc {cmd.rc}"
    extra = f"; {cmd.reason}" if cmd.reason else ""
    log = f", log `{cmd.log}`" if cmd.log else ""
    lines = [f"- **{cmd.label}**: {state}, {cmd.seconds:.1f} s{extra}{log}", "", "  ```"]
    lines += [f"  {cmd.command}", "  ```", ""]
    if cmd.gpu_command and cmd.gpu_command != cmd.command:
        lines += ["  on a GPU:", "", "  ```", f"  {cmd.gpu_command}", "  ```", ""]
    if cmd.config_check:
        lines += [f"  config check (`--cfg job`): {cmd.config_check}", ""]
    return lines


def _status(status: str) -> str:
    return status.replace("_", " ")


def _cell(value: object) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    if value == []:
        return "none"
    if isinstance(value, (list, dict)):
        value = json.dumps(value, default=str)
    return str(value).replace("|", "\\|").replace("\n", " ")
