"""The report's figures: Optuna's own plots where Optuna has one (history, parallel coordinates,
importances, slices, Pareto front), and plotly figures for what it has not: learning curves by
how each line ended, a timeline per worker, the cost per trial.

Each builder returns a plotly figure, or raises `NotDrawn` with why (too few trials, one
parameter...): the page says so in place of the plot.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from .records import COLOURS, Ending, Line, StudyRecord, TrialRecord

if TYPE_CHECKING:
    from optuna import Study
    from optuna.importance import BaseImportanceEvaluator
    from optuna.trial import FrozenTrial
    from plotly.graph_objects import Figure, Scatter


class NotDrawn(Exception):
    """A figure the study has no data for (its message says what is missing)."""


def _target(study: Study) -> Callable[[FrozenTrial], float] | None:
    """Optuna's plots of one objective: the first, for several (named record.metrics[0])."""
    return None if len(study.directions) == 1 else _first_value


def _first_value(t: FrozenTrial) -> float:
    return t.values[0]


def _completed(study: Study, at_least: int, what: str) -> None:
    from optuna.trial import TrialState

    n = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    if n < at_least:
        raise NotDrawn(f"{what} needs {at_least} completed trials; the study has {n}")


def history(record: StudyRecord, study: Study) -> Figure:
    from optuna.visualization import plot_optimization_history

    _completed(study, 1, "the history")
    return plot_optimization_history(study, target=_target(study), target_name=record.metrics[0])


def parallel(record: StudyRecord, study: Study) -> Figure:
    from optuna.visualization import plot_parallel_coordinate

    _completed(study, 2, "parallel coordinates")
    return plot_parallel_coordinate(study, target=_target(study), target_name=record.metrics[0])


def evaluator() -> BaseImportanceEvaluator:
    """Optuna's default importance evaluator (fANOVA). Before Optuna 5 it needs scikit-learn,
    which this project does not install: PED-ANOVA then, Optuna's own and dependency-free."""
    import optuna

    try:
        return optuna.importance.FanovaImportanceEvaluator()
    except ImportError:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "experimental" in Optuna 4
            return optuna.importance.PedAnovaImportanceEvaluator()


def importance_order(study: Study) -> list[str]:
    """The parameters, most important first (by the first objective)."""
    import optuna

    _completed(study, 2, "parameter importances")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = optuna.importance.get_param_importances(
            study, evaluator=evaluator(), target=_target(study)
        )
    if not found:
        raise NotDrawn("parameter importances need a parameter that varies")
    return list(found)


def importances(record: StudyRecord, study: Study) -> Figure:
    from optuna.visualization import plot_param_importances

    importance_order(study)  # NotDrawn when there is nothing to rank
    return plot_param_importances(
        study, evaluator=evaluator(), target=_target(study), target_name=record.metrics[0]
    )


def slices(record: StudyRecord, study: Study) -> Figure:
    from optuna.visualization import plot_slice

    top = importance_order(study)[:2]
    return plot_slice(study, params=top, target=_target(study), target_name=record.metrics[0])


def pareto(record: StudyRecord, study: Study) -> Figure:
    from optuna.visualization import plot_pareto_front

    if len(study.directions) < 2:
        raise NotDrawn("a Pareto front needs several objectives")
    _completed(study, 1, "the Pareto front")
    names = list(record.metrics)
    return plot_pareto_front(study, target_names=names if len(names) <= 3 else None)


def curves(record: StudyRecord, study: Study) -> Figure:
    """One curve per line, coloured by how it ended; a diamond where asha paused it."""
    import plotly.graph_objects as go

    lines = [line for line in record.lines() if line.curve]
    if not lines:
        raise NotDrawn("no trial reported an intermediate value")
    fig = go.Figure()
    for ending in COLOURS:
        group = [line for line in lines if line.ending == ending]
        if group:
            fig.add_trace(_curve_trace(ending, group))
    pauses = [(line, at) for line in lines for at in line.pauses]
    if pauses:
        values = [dict(line.curve)[at] for line, at in pauses]
        fig.add_trace(
            go.Scatter(
                x=[at for _, at in pauses],
                y=values,
                mode="markers",
                name="paused here",
                marker={"symbol": "diamond", "size": 9, "color": COLOURS["paused"]},
                text=[line.label for line, _ in pauses],
            )
        )
    metric = record.metrics[0] if len(record.metrics) == 1 else "reported value"
    fig.update_layout(title="Learning curves", xaxis_title=record.unit, yaxis_title=metric)
    return fig


def _curve_trace(ending: Ending, group: list[Line]) -> Scatter:
    """The lines of one ending as one trace, split by gaps (fast for hundreds of lines)."""
    import plotly.graph_objects as go

    xs: list[int | None] = []
    ys: list[float | None] = []
    text: list[str] = []
    for line in group:
        for x, y in line.curve:
            xs.append(x)
            ys.append(y)
            text.append(line.label)
        xs.append(None)
        ys.append(None)
        text.append("")
    return go.Scatter(
        x=xs,
        y=ys,
        mode="lines+markers",
        name=f"{ending} ({len(group)})",
        line={"color": COLOURS[ending], "width": 1.5},
        marker={"size": 4},
        text=text,
        hovertemplate="%{text}<br>%{x}: %{y}<extra></extra>",
    )


def batches(record: StudyRecord, study: Study) -> Figure:
    """Each adaptive trial's effective batch over the data it saw (a step at each doubling, to
    the data it reached), coloured by how it ended."""
    import plotly.graph_objects as go

    grown = [t for t in record.ran if t.batches]
    if not grown:
        raise NotDrawn("no trial ran with training.batch_schedule=adaptive")
    fig = go.Figure()
    for t in grown:
        xs, ys = [x for x, _ in t.batches], [b for _, b in t.batches]
        end = record.budget if t.state == "COMPLETE" else t.reached
        if end is not None and record.unit == "samples" and end > xs[-1]:
            xs, ys = [*xs, end], [*ys, ys[-1]]
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines+markers",
                line={"shape": "hv", "color": COLOURS[t.ending], "width": 1.5},
                name=f"trial {t.number} ({t.ending})",
            )
        )
    fig.update_layout(
        title="Effective batch over the data (training.batch_schedule=adaptive)",
        xaxis_title="samples seen",
        yaxis_title="effective batch",
        yaxis_type="log",
    )
    return fig


def who(t: TrialRecord) -> str:
    """A timeline row: the worker, and the devices it was pinned to."""
    name = t.worker or "one process"
    return f"{name} (GPU {t.devices})" if t.devices else name


def timeline(record: StudyRecord, study: Study) -> Figure:
    """When each trial ran, one row per worker and device: the gaps are idle devices."""
    import plotly.graph_objects as go

    timed = [t for t in record.ran if t.started is not None]
    if not timed:
        raise NotDrawn("no trial has a start time")
    now = max(t.ended or t.started or datetime.min for t in timed)
    fig = go.Figure()
    for ending in COLOURS:
        group = [t for t in timed if t.ending == ending]
        if not group:
            continue
        fig.add_trace(
            go.Bar(
                y=[who(t) for t in group],
                x=[_ms(t.started, t.ended or now) for t in group],
                base=[_iso(t.started) for t in group],
                orientation="h",
                name=ending,
                marker_color=COLOURS[ending],
                text=[f"trial {t.number}" for t in group],
                hovertemplate="%{text}<br>%{base} +%{x:.0f} ms<extra></extra>",
            )
        )
    fig.update_layout(title="Trials per worker", barmode="overlay", xaxis_type="date")
    return fig


def cost(record: StudyRecord, study: Study) -> Figure:
    """Device-seconds per trial, coloured by how it ended."""
    import plotly.graph_objects as go

    paid = [t for t in record.ran if t.device_seconds is not None]
    if not paid:
        raise NotDrawn("no trial recorded its device-seconds")
    fig = go.Figure()
    for ending in COLOURS:
        group = [t for t in paid if t.ending == ending]
        if group:
            fig.add_trace(
                go.Bar(
                    x=[t.number for t in group],
                    y=[t.device_seconds for t in group],
                    name=ending,
                    marker_color=COLOURS[ending],
                )
            )
    fig.update_layout(title="Device-seconds per trial", xaxis_title="trial", yaxis_title="s")
    return fig


def _ms(start: datetime | None, end: datetime) -> float:
    return max(0.0, (end - start).total_seconds() * 1000.0) if start is not None else 0.0


def _iso(d: datetime | None) -> str:
    return d.isoformat(sep=" ") if d is not None else ""


Builder = Callable[[StudyRecord, "Study"], "Figure"]
