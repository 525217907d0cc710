"""The report's tables: the best trial and how to rerun it, what each worker did, what the
study spent and what pruning saved, and the batch plan each trial ran with."""

from __future__ import annotations

import html
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from app.studies.transfer import Transfer

from .figures import who
from .records import Line, StudyRecord, TrialRecord

PRUNED_ENDINGS = ("pruned", "paused")  # lines a pruner stopped before the budget


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cell(v: object) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return html.escape(str(v))


def best_table(record: StudyRecord) -> str:
    best = record.best()
    if best is not None:
        return _trial_facts(best, record)
    front = [t for t in record.ran if t.state == "COMPLETE" and t.values]
    if len(record.directions) > 1 and front:
        rows = [(t.number, *(t.values or ()), _params(t), t.run_dir) for t in front]
        header = ("trial", *record.metrics, "parameters", "run dir")
        return "<p>Completed trials (the Pareto front is drawn below):</p>" + table(header, rows)
    return "<p class='none'>No trial completed.</p>"


def _trial_facts(t: TrialRecord, record: StudyRecord) -> str:
    rows = [
        ("trial", t.number),
        (record.metrics[0], t.values[0] if t.values else None),
        *((f"param {k}", v) for k, v in t.params.items()),
        ("run dir", t.run_dir),
    ]
    command = f"<pre>{html.escape(t.command)}</pre>" if t.command else ""
    return table(("", ""), rows) + command


def transfer_table(transfer: Transfer) -> str:
    """A μP study's widths, its target and the command that trains it with the best values."""
    r, run = transfer.record, transfer.run
    rows: list[tuple[str, object]] = [
        ("trials at width", r.width),
        ("base width (model.mup.base_width)", r.base_width),
        ("base head width (model.mup.base_head_dim)", r.base_head_dim),
        ("target (hpo.transfer.target)", " ".join(r.target) or "none given"),
    ]
    if run is not None:
        rows += [("target run", f"{run.status} in {run.run_dir}"), ("its value", run.value)]
        rows += [("its device-seconds", run.device_seconds)]
    how = "<p>The target, trained with the best configuration:</p>"
    command = f"{how}<pre>{html.escape(transfer.command)}</pre>" if transfer.command else ""
    return table(("", ""), rows) + command


def _params(t: TrialRecord) -> str:
    return ", ".join(f"{k}={v}" for k, v in t.params.items())


def workers_table(record: StudyRecord) -> str:
    """Per worker and device: trials run, busy time, idle gaps between its trials."""
    rows = []
    for name, trials in _by_worker(record).items():
        spans = sorted((t.started, t.ended) for t in trials if t.started and t.ended)
        busy = sum((e - s).total_seconds() for s, e in spans)
        idle = sum(max(0.0, (b[0] - a[1]).total_seconds()) for a, b in itertools.pairwise(spans))
        rows.append((name, len(trials), busy, idle))
    if not rows:
        return "<p class='none'>No trial ran.</p>"
    return table(("worker", "trials", "busy s", "idle s between trials"), rows)


def _by_worker(record: StudyRecord) -> dict[str, list[TrialRecord]]:
    out: dict[str, list[TrialRecord]] = {}
    for t in record.ran:
        out.setdefault(who(t), []).append(t)
    return out


@dataclass(frozen=True)
class Savings:
    """What stopping lines early saved against running each to the budget."""

    lines: int
    axis_saved: int  # report-axis units not run (steps, samples...)
    seconds_saved: float  # device-seconds, at each line's own rate


def savings(record: StudyRecord) -> Savings:
    budget = record.full_budget()
    axis, seconds, n = 0, 0.0, 0
    for line in record.lines():
        reached = line.last.reached
        if line.ending not in PRUNED_ENDINGS or budget is None or reached is None:
            continue
        n += 1
        axis += max(0, budget - reached)
        if reached > 0:  # stopped at its first report: no rate to scale by
            seconds += _line_seconds(line) * max(0.0, budget / reached - 1.0)
    return Savings(n, axis, seconds)


def _line_seconds(line: Line) -> float:
    return sum(t.device_seconds or 0.0 for t in line.trials)


def cost_table(record: StudyRecord) -> str:
    paid = [t.device_seconds for t in record.ran if t.device_seconds is not None]
    spent = sum(paid)
    s = savings(record)
    rows: list[tuple[str, object]] = [
        ("device-seconds, all trials", spent if paid else "not recorded"),
        ("lines the pruner stopped (pruned, or paused and never promoted)", s.lines),
        (f"{record.unit} they did not run", s.axis_saved),
        ("device-seconds saved (at each line's own rate)", s.seconds_saved),
    ]
    if spent + s.seconds_saved > 0:
        rows.append(("saved, of what running all to the end costs", _percent(s, spent)))
    return table(("", ""), [*_budget_rows(record), *rows])


FINISHED = ("complete", "promoted")  # line endings that reached the budget


def _budget_rows(record: StudyRecord) -> list[tuple[str, object]]:
    """How hpo.budget_trials was spent: the trials it bought with what pruning saved."""
    if record.budget_trials is None:
        return []
    lines = record.lines()
    worth = sum(line.worth(record.full_budget()) for line in lines)
    return [
        ("budget: full trials' worth of training (hpo.budget_trials)", record.budget_trials),
        ("spent: full trials' worth", round(worth, 2)),
        ("configurations it bought (lines of trials)", len(lines)),
        ("of them trained to the end", sum(line.ending in FINISHED for line in lines)),
    ]


def _percent(s: Savings, spent: float) -> str:
    return f"{100.0 * s.seconds_saved / (spent + s.seconds_saved):.0f} %"


def plan_table(record: StudyRecord) -> str:
    rows = [
        (
            t.number,
            t.ending,
            t.reason,
            t.micro_batch_size,
            t.grad_accum_steps,
            t.batch_source,
            t.device_seconds,
            t.reached,
            t.run_dir,
        )
        for t in record.ran
    ]
    header = ("trial", "ended", "reason", "micro-batch", "accumulation", "plan", "device s")
    return table((*header, f"last {record.unit}", "run dir"), rows)
