"""The suite's records and DIR/report.json: loaded, merged by step name, written atomically.

A suite run in parts (`--steps`, `--only`, `--pending`) appends to the same DIR: the steps a
part runs replace their earlier records, the others are kept, and each part is listed.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.core.atomic import atomic_write_text

SCHEMA = "hydratrain-gpu-suite/1"
STEP_STATUSES = ("passed", "failed", "timed_out", "skipped", "not_run")
COMMAND_STATUSES = ("ok", "failed", "timed_out", "skipped")
DONE = ("passed", "failed", "timed_out", "skipped")  # what --pending does not run again


@dataclass
class CommandRecord:
    label: str
    command: str  # as run from the repository root ("python" is the suite's interpreter)
    argv: list[str]
    status: str = "skipped"  # one of COMMAND_STATUSES
    rc: int | None = None
    seconds: float = 0.0
    limit_s: float | None = None
    reason: str | None = None  # why skipped, failed or timed out
    log: str | None = None  # relative to DIR
    tail: list[str] = field(default_factory=list)
    gpu_command: str | None = None  # dry run: the command the GPU run uses instead
    config_check: str | None = None  # dry run: "ok", or the line `--cfg job` refused it with


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""
    goal: bool = False  # a target to report; missing it does not fail the step


@dataclass
class StepRecord:
    number: int
    name: str
    title: str
    status: str = "not_run"  # one of STEP_STATUSES
    reason: str | None = None
    seconds: float = 0.0
    limit_s: float = 0.0
    device: str | None = None
    finished_at: str | None = None
    commands: list[CommandRecord] = field(default_factory=list)
    figures: dict[str, object] = field(default_factory=dict)  # shown as they are
    checks: list[Check] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StepRecord:
        rec = cls(**{k: v for k, v in d.items() if k not in ("commands", "checks")})
        rec.commands = [CommandRecord(**c) for c in d.get("commands", [])]
        rec.checks = [Check(**c) for c in d.get("checks", [])]
        return rec


@dataclass
class Report:
    header: dict[str, object] = field(default_factory=dict)  # the machine (render.HEADER_ROWS)
    steps: list[StepRecord] = field(default_factory=list)
    parts: list[dict[str, str]] = field(default_factory=list)  # started, command, device

    def step(self, name: str) -> StepRecord | None:
        return next((s for s in self.steps if s.name == name), None)

    def put(self, rec: StepRecord) -> None:
        self.steps = [s for s in self.steps if s.name != rec.name] + [rec]
        self.steps.sort(key=lambda s: s.number)

    def to_dict(self) -> dict[str, object]:
        steps = [asdict(s) for s in self.steps]
        return {"schema": SCHEMA, "header": self.header, "parts": self.parts, "steps": steps}


def load(out: Path) -> Report:
    """The report a previous part left in DIR, or a new one (an unreadable file is not merged)."""
    return load_file(out / "report.json")


def load_file(path: Path) -> Report:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return Report()
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        return Report()
    steps = [StepRecord.from_dict(s) for s in data.get("steps", [])]
    return Report(data.get("header", {}), steps, data.get("parts", []))


def write(out: Path, report: Report, markdown: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    # A suite killed mid-write leaves the previous complete file, never half of one.
    atomic_write_text(
        out / "report.json", json.dumps(report.to_dict(), indent=2, default=str) + "\n"
    )
    atomic_write_text(out / "report.md", markdown)


def now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z")


def merged(earlier: Report, current: Report) -> Report:
    """An earlier loan's report with this DIR's on top: a step DIR has replaces the earlier
    record of it; the parts of both are listed; the header is this machine's."""
    out = Report({**earlier.header, **current.header}, list(earlier.steps), [*earlier.parts])
    for rec in current.steps:
        out.put(rec)
    out.parts += [p for p in current.parts if p not in out.parts]
    return out
