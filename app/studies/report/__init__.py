"""A study's report: `report.html` (self-contained: opens offline, with no server) and PNGs of
its main plots, from typed records of its trials (`records.py`) and the Optuna study itself
(for Optuna's own plots).

The sweeper writes one after every sweep; `python -m app.report` writes one for any study.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from app.core.atomic import atomic_write_text

from .images import write_images
from .page import render
from .records import COLOURS, Ending, Line, StudyRecord, TrialRecord

if TYPE_CHECKING:
    from optuna import Study

REPORT = "report.html"

__all__ = [
    "COLOURS",
    "REPORT",
    "Ending",
    "Line",
    "StudyRecord",
    "TrialRecord",
    "preload",
    "write_report",
]


def write_report(
    record: StudyRecord, study: Study, out: str | Path, extra_images: dict[str, Path] | None = None
) -> Path:
    """Write out/report.html and the PNGs beside it; `extra_images` ({title: png}) are embedded
    too (the batch-size study's curve). Returns the page's path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    study = own_trials(study, record)
    write_images(record, study, out)
    page = out / REPORT
    atomic_write_text(page, render(record, study, extra_images or {}))  # never half a page
    return page


def own_trials(study: Study, record: StudyRecord) -> Study:
    """The study, or where it holds trials borrowed from earlier studies (hpo.warm_start) a
    copy in memory of its own trials, which Optuna's plots then draw (renumbered from 0)."""
    borrowed = {t.number for t in record.trials if t.ending == "borrowed"}
    if not borrowed:
        return study
    import optuna

    own = optuna.create_study(directions=study.directions, study_name=study.study_name)
    own.add_trials([t for t in study.get_trials(deepcopy=False) if t.number not in borrowed])
    if study.metric_names:
        own.set_metric_names(study.metric_names)
    return own


def preload() -> None:
    """Import what drawing the report takes (plotly, Optuna's plots, matplotlib: about 0.4 s),
    for a process that waits anyway (a fleet's parent, while its workers run the study) and
    writes the report when the wait ends."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot
    import optuna.visualization  # noqa: F401
    import plotly.graph_objects  # noqa: F401
