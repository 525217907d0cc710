"""The study's report (report.html, written by app/studies/report): Optuna's trials read as
the report's records, with what this sweeper recorded on them (how each ended, its line, its
worker, its cost and batch plan), and written after every sweep without ever failing one.

A study of plain Optuna reads too: its trials have states, values, params and reports only.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from app.core.outcomes import Status
from app.hpo import TrialAttrs
from app.studies.batch_size import IMAGE as BATCH_STUDY_IMAGE
from app.studies.report import Ending, StudyRecord, TrialRecord, write_report

from .. import _private as private
from .._pruners._asha import PAUSED
from .._pruners._companion import MAIN_TRIAL
from .._pruners._learned import BORROWED, BUDGET, UNIT, record_report_end
from .._pruners._lineage import root
from .._study._cost import BUDGET_TRIALS
from ._commands import command, transfer_record, trial_overrides

log = logging.getLogger(__name__)

# A trial's reason (user attr `reason`, written by `_outcomes.py` in the runs' Status words)
# -> how the report says it ended.
ENDINGS: dict[str, Ending] = {
    Status.PAUSED.value: "paused",
    Status.OOM.value: "oom",
    Status.DIVERGED.value: "diverged",
    Status.PREEMPTED.value: "preempted",
}


def describe(study: optuna.Study, metrics: list[str] | None, unit: str, budget: int) -> None:
    """Name the objectives (Optuna's own tools show them) and record the report axis."""
    if metrics and list(study.metric_names or []) != metrics:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(metrics)
    record_report_end(study, unit, budget)


def study_record(study: optuna.Study, storage: str) -> StudyRecord:
    n = len(study.directions)
    names = list(study.metric_names or []) or (["value"] if n == 1 else [])
    metrics = tuple(names) if len(names) == n else tuple(f"objective {i}" for i in range(n))
    reports = _companion_reports(study)
    budget = study.user_attrs.get(BUDGET)
    record = StudyRecord(
        name=study.study_name,
        directions=tuple(d.name.lower() for d in study.directions),
        metrics=metrics,
        trials=tuple(
            trial_record(t, reports.get(t.number)) for t in study.get_trials(deepcopy=False)
        ),
        unit=str(study.user_attrs.get(UNIT, "steps")),
        budget=int(budget) if isinstance(budget, int | float) else None,
        storage=storage,
        budget_trials=_number(study.user_attrs.get(BUDGET_TRIALS)),
        transfer=transfer_record(study),
    )
    return _with_rerun_command(record)


def _with_rerun_command(record: StudyRecord) -> StudyRecord:
    """The best trial with the command that reruns it (read from its run dir: one file, not
    one per trial)."""
    best = record.best()
    if best is None:
        return record
    rerun = dataclasses.replace(best, command=rerun_command(best.run_dir))
    trials = tuple(rerun if t is best else t for t in record.trials)
    return dataclasses.replace(record, trials=trials)


def trial_record(t: FrozenTrial, reports: dict[int, float] | None = None) -> TrialRecord:
    attrs = TrialAttrs.from_user_attrs(t.user_attrs)
    worker = t.user_attrs.get("worker")
    host, pid = t.user_attrs.get("host"), t.user_attrs.get("worker_pid")
    return TrialRecord(
        number=t.number,
        state=t.state.name,
        ending=ending(t),
        line=root(t),
        values=tuple(t.values) if t.values else None,
        params=dict(t.params),
        curve=tuple(sorted((reports or t.intermediate_values).items())),
        started=t.datetime_start,
        ended=t.datetime_complete,
        worker=f"worker {worker}" if worker is not None else (f"{host}:{pid}" if host else None),
        devices=t.user_attrs.get("devices"),
        device_seconds=attrs.device_seconds,
        micro_batch_size=attrs.micro_batch_size,
        grad_accum_steps=attrs.grad_accum_steps,
        batch_source=attrs.batch_source,
        batches=tuple((p["samples"], p["batch"]) for p in attrs.batch_schedule or ()),
        run_dir=attrs.run_dir,
        reason=str(t.user_attrs.get("reason", "")),
    )


def ending(t: FrozenTrial) -> Ending:
    reason = str(t.user_attrs.get("reason", ""))
    if reason == BORROWED:  # observed from an earlier study (hpo.warm_start), not run here
        return "borrowed"
    if t.state == TrialState.COMPLETE:
        return "complete"
    if t.state in (TrialState.RUNNING, TrialState.WAITING):
        return "running"
    if t.state == TrialState.PRUNED and PAUSED in t.system_attrs:
        return "paused"
    if reason in ENDINGS:
        return ENDINGS[reason]
    return "pruned" if t.state == TrialState.PRUNED else "failed"


def rerun_command(run_dir: str | None) -> str | None:
    """`python -m app.train` with the trial's own overrides (Hydra's record of the job), less
    those that made it a trial of a study."""
    overrides = trial_overrides(run_dir)
    return None if overrides is None else command(overrides)


def _companion_reports(study: optuna.Study) -> dict[int, dict[int, float]]:
    """Several objectives: each main trial's reports, which its companion trial took."""
    if len(study.directions) == 1:
        return {}
    storage = private.storage_of(study)
    out: dict[int, dict[int, float]] = {}
    for name in optuna.get_all_study_names(storage):
        if not name.startswith(f"{study.study_name}:"):
            continue
        companion = optuna.load_study(study_name=name, storage=storage)
        for c in companion.get_trials(deepcopy=False):
            if MAIN_TRIAL in c.system_attrs:
                out[int(c.system_attrs[MAIN_TRIAL])] = dict(c.intermediate_values)
    return out


def write_sweep_report(study: optuna.Study, storage: str, sweep_dir: str) -> Path | None:
    """report.html in the sweep dir; a failure is one warning line, never a failed sweep."""
    try:
        image = Path(sweep_dir, BATCH_STUDY_IMAGE)
        extra = {"Batch-size study": image} if image.is_file() else {}
        return write_report(study_record(study, storage), study, sweep_dir, extra)
    except Exception as e:
        log.warning("The study's report was not written: %s: %s", type(e).__name__, e)
        return None


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
