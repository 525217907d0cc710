"""Reading what the trainer, the bench and pytest leave behind: summary.json, metrics.jsonl,
the start-up banner, a JUnit XML file and the bench's JSON report. Files only: the trainer's
modules are never imported, so moving them around does not break the suite."""

from __future__ import annotations

import json
import math
import re
import statistics
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

BANNER_KEYS = ("device", "precision", "batch", "autobatch", "tokens", "samples", "eval", "done")


def summary(run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
    return data


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def series(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def banner(log: Path) -> dict[str, str]:
    """The run's plan as printed at start: `device     cuda: NVIDIA H100 (preset h100)` ->
    {"device": "cuda: NVIDIA H100 (preset h100)"}; the first line of each kind."""
    out: dict[str, str] = {}
    for line in log.read_text(errors="replace").splitlines():
        m = re.match(r"^([a-z]+) {2,}(\S.*)$", line)
        if m and m.group(1) in BANNER_KEYS:
            out.setdefault(m.group(1), m.group(2).strip())
    return out


def loss_fell(s: dict[str, Any]) -> tuple[bool, str]:
    first, last = s.get("initial_val_loss"), s.get("final_val_loss")
    if not isinstance(first, (int, float)) or not isinstance(last, (int, float)):
        return False, f"initial {first}, final {last}"
    ok = math.isfinite(last) and last < first
    return ok, f"{first:.4f} -> {last:.4f}"


def junit(path: Path) -> dict[str, Any]:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    count = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors")}
    count["skipped"] = sum(int(s.get("skipped", 0)) for s in suites)
    bad = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in root.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    passed = count["tests"] - count["failures"] - count["errors"] - count["skipped"]
    return {**count, "passed": passed, "not_passed": bad}


def bench_rows(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(path.read_text())["rows"]
    return rows


def trial_summaries(sweep_dir: Path) -> list[dict[str, Any]]:
    """Each trial's summary.json in a multirun directory (trials are numbered subdirectories)."""
    found = [p for p in sweep_dir.glob("*/summary.json") if p.parent.name.isdigit()]
    return [json.loads(p.read_text()) for p in sorted(found, key=lambda p: int(p.parent.name))]


def tensorboard_tags_script() -> str:
    """One line for a child interpreter: the scalar tags of a run's TensorBoard events
    (tensorboard is imported there, not by the suite)."""
    return (
        "import json, sys; "
        "from tensorboard.backend.event_processing import event_accumulator as ea; "
        "acc = ea.EventAccumulator(sys.argv[1], size_guidance={ea.SCALARS: 0}).Reload(); "
        "print('TAGS ' + json.dumps(sorted(acc.Tags()['scalars'])))"
    )


def tags_from_log(log: Path) -> list[str]:
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("TAGS "):
            tags: list[str] = json.loads(line[5:])
            return tags
    raise ValueError(f"no TAGS line in {log}")
