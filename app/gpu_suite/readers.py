"""Reading what the trainer, the bench and pytest leave behind: summary.json, metrics.jsonl,
the start-up banner, a JUnit XML file and the bench's JSON report.

summary.json is read through the trainer's own record, `Summary` (app/engine/records/summary.py,
which imports nothing of torch or the rest of the trainer), and the bench's rows through its `Row`:
a field renamed there is a mypy error here, not a figure that silently reads None. Everything
else of the trainer is run through its command line, never imported, so the suite's own
process stays free of torch."""

from __future__ import annotations

import json
import math
import statistics
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from app.bench.throughput.report import Row
from app.engine.records.batch import Candidate
from app.engine.records.summary import Summary

MetricsRow = Mapping[str, object]  # one line of metrics.jsonl: a step and its scalars


def summary(run_dir: Path) -> Summary:
    return Summary.read(run_dir)


def metrics(run_dir: Path) -> list[MetricsRow]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def series(rows: Sequence[MetricsRow], key: str) -> list[float]:
    values = (r.get(key) for r in rows)
    return [float(v) for v in values if isinstance(v, (int, float))]


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def printed(log: Path) -> list[str]:
    """A command's output, line by line."""
    return log.read_text(errors="replace").splitlines()


def loss_fell(s: Summary) -> tuple[bool, str]:
    first, last = s.initial_val.get("loss"), s.final_val.get("loss")
    if first is None or last is None:
        return False, f"initial {first}, final {last}"
    ok = math.isfinite(last) and last < first
    return ok, f"{first:.4f} -> {last:.4f}"


def candidates(s: Summary) -> list[Candidate]:
    """The rows of the probe's table (none when the micro-batch was set, or the run failed
    before the probe)."""
    probe = s.batch_details.probe
    return probe.candidates if probe is not None else []


def memory_limit_fraction(s: Summary) -> float | None:
    probe = s.batch_details.probe
    return probe.memory_limit_fraction if probe is not None else None


@dataclass(frozen=True)
class JUnit:
    """A pytest run's counts, in the order the report shows them."""

    tests: int
    passed: int
    failures: int
    errors: int
    skipped: int
    not_passed: list[str]  # classname::name of each failure or error


def junit(path: Path) -> JUnit:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))

    def total(key: str) -> int:
        return sum(int(s.get(key, 0)) for s in suites)

    tests, failures, errors, skipped = (
        total(k) for k in ("tests", "failures", "errors", "skipped")
    )
    bad = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in root.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    passed = tests - failures - errors - skipped
    return JUnit(tests, passed, failures, errors, skipped, bad)


def bench_rows(path: Path) -> list[Row]:
    rows: list[Row] = json.loads(path.read_text())["rows"]
    return rows


def trial_summaries(sweep_dir: Path) -> list[Summary]:
    """Each trial's summary.json in a multirun directory (trials are numbered subdirectories)."""
    found = [p.parent for p in sweep_dir.glob("*/summary.json") if p.parent.name.isdigit()]
    return [Summary.read(p) for p in sorted(found, key=lambda p: int(p.name))]


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
    for line in printed(log):
        if line.startswith("TAGS "):
            tags: list[str] = json.loads(line[5:])
            return tags
    raise ValueError(f"no TAGS line in {log}")
