"""PNG images of the report's main plots, beside report.html: for a README, a slide, or a
terminal user. matplotlib (Optuna's own matplotlib plots where it has them)."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from .figures import NotDrawn, evaluator, importance_order
from .records import COLOURS, StudyRecord

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from optuna import Study

log = logging.getLogger(__name__)

HISTORY = "optimization_history.png"
CURVES = "learning_curves.png"
IMPORTANCES = "param_importances.png"


def write_images(record: StudyRecord, study: Study, out: Path) -> list[Path]:
    """The PNGs that could be drawn; one that cannot is skipped with a debug line."""
    import matplotlib

    matplotlib.use("Agg")  # no display: a cluster node, CI
    written = []
    for name, draw in ((CURVES, _curves), (HISTORY, _history), (IMPORTANCES, _importances)):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Optuna's matplotlib plots are "experimental"
                figure = draw(record, study)
        except NotDrawn as e:
            log.debug("report: %s not drawn: %s", name, e)
            continue
        figure.set_size_inches(8, 4.5)
        figure.tight_layout()
        figure.savefig(out / name, dpi=100)
        _close(figure)
        written.append(out / name)
    return written


def _close(figure: Figure) -> None:
    import matplotlib.pyplot as plt

    plt.close(figure)


def _curves(record: StudyRecord, study: Study) -> Figure:
    import matplotlib.pyplot as plt

    lines = [line for line in record.lines() if line.curve]
    if not lines:
        raise NotDrawn("no trial reported an intermediate value")
    figure, ax = plt.subplots()
    labelled: set[str] = set()
    for line in lines:
        xs, ys = zip(*line.curve, strict=True)
        label = None if line.ending in labelled else line.ending
        labelled.add(line.ending)
        ax.plot(xs, ys, color=COLOURS[line.ending], lw=1, marker=".", ms=3, label=label)
    ax.set_xlabel(record.unit)
    ax.set_ylabel(record.metrics[0] if len(record.metrics) == 1 else "reported value")
    ax.set_title(f"Learning curves of study {record.name}")
    ax.legend()
    return figure


def _history(record: StudyRecord, study: Study) -> Figure:
    from optuna.visualization.matplotlib import plot_optimization_history

    if len(study.directions) != 1 or record.best() is None:
        raise NotDrawn("the history is drawn for one objective with a completed trial")
    return _figure(plot_optimization_history(study, target_name=record.metrics[0]))


def _importances(record: StudyRecord, study: Study) -> Figure:
    from optuna.visualization.matplotlib import plot_param_importances

    importance_order(study)
    target = None if len(study.directions) == 1 else (lambda t: t.values[0])
    axes = plot_param_importances(
        study, evaluator=evaluator(), target=target, target_name=record.metrics[0]
    )
    return _figure(axes)


def _figure(axes: Axes) -> Figure:
    """The figure an Optuna plot drew on: its own, never a subfigure of another."""
    from matplotlib.figure import Figure

    figure = axes.figure
    if not isinstance(figure, Figure):
        raise NotDrawn("the plot was drawn into a subfigure")
    return figure
