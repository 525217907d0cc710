"""The report as one self-contained HTML page: plotly's script inlined once, every figure and
image in the file, nothing fetched when it opens (a laptop offline, a file copied off a cluster).
"""

from __future__ import annotations

import base64
import html
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .figures import (
    Builder,
    NotDrawn,
    batches,
    cost,
    curves,
    history,
    importances,
    parallel,
    pareto,
    slices,
    timeline,
)
from .records import StudyRecord, endings
from .tables import best_table, cost_table, plan_table, transfer_table, workers_table

if TYPE_CHECKING:
    from optuna import Study

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Plot:
    """A section drawn by a figure builder."""

    id: str
    title: str
    build: Builder
    several_objectives: bool | None = None  # None: every study; True or False: only those


PLOTS = (
    Plot("history", "Optimization history", history, several_objectives=False),
    Plot("pareto", "Pareto front", pareto, several_objectives=True),
    Plot("curves", "Learning curves", curves),
    Plot("importances", "Parameter importances", importances),
    Plot("parallel", "Parallel coordinates", parallel),
    Plot("slices", "Slices of the two most important parameters", slices),
    Plot("timeline", "Timeline per worker and device", timeline),
    Plot("cost", "Cost", cost),
    Plot("batches", "Effective batch over the data", batches),
)


def plots_for(record: StudyRecord) -> list[Plot]:
    several = len(record.directions) > 1
    return [p for p in PLOTS if p.several_objectives in (None, several)]


def render(record: StudyRecord, study: Study, images: dict[str, Path]) -> str:
    """The page: a head with the study's facts, then one section per plot, table and image."""
    from plotly.offline import get_plotlyjs

    parts = [_head(record), _summary(record)]
    for plot in plots_for(record):
        parts.append(_plot_section(plot, record, study))
    parts.append(_section("plan", "Batch plan per trial", plan_table(record)))
    for name, path in images.items():
        parts.append(_image_section(name, path))
    body = "\n".join(parts)
    return (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
        f"<title>Study {html.escape(record.name)}</title><style>{STYLE}</style>"
        f"<script>{get_plotlyjs()}</script></head>\n<body>\n{body}\n</body></html>\n"
    )


def _head(record: StudyRecord) -> str:
    objectives = ", ".join(
        f"{m} ({d})" for m, d in zip(record.metrics, record.directions, strict=True)
    )
    counts = ", ".join(f"{n} {e}" for e, n in sorted(endings(record.ran).items()))
    return (
        f"<h1>Study {html.escape(record.name)}</h1>"
        f"<p>{html.escape(objectives)}; {len(record.ran)} trials run "
        f"({len(record.lines())} configurations): {html.escape(counts)}.{_borrowed(record)}"
        f"<br>Storage: <code>{html.escape(record.storage)}</code>; trials report in "
        f"{html.escape(record.unit)}.</p>"
    )


def _borrowed(record: StudyRecord) -> str:
    n = sum(t.ending == "borrowed" for t in record.trials)
    return f" {n} trials borrowed from earlier studies (hpo.warm_start), not run here." if n else ""


def _summary(record: StudyRecord) -> str:
    sections = [_section("best", "Best", best_table(record))]
    if record.transfer is not None:
        sections.append(_section("transfer", "The target (μP)", transfer_table(record.transfer)))
    sections.append(_section("workers", "Workers", workers_table(record)))
    sections.append(_section("spent", "What the study spent", cost_table(record)))
    return "\n".join(sections)


def _plot_section(plot: Plot, record: StudyRecord, study: Study) -> str:
    try:
        figure = plot.build(record, study)
    except NotDrawn as e:
        return _section(plot.id, plot.title, _not_drawn(e))
    except Exception as e:  # one figure's failure costs its section, not the report
        log.warning("report: %s not drawn: %s", plot.id, e)
        return _section(plot.id, plot.title, _not_drawn(e))
    figure.update_layout(height=420, margin={"t": 50})
    div = figure.to_html(full_html=False, include_plotlyjs=False, div_id=f"plot-{plot.id}")
    return _section(plot.id, plot.title, div, drawn=True)


def _not_drawn(e: Exception) -> str:
    return f"<p class='none'>Not drawn: {html.escape(str(e))}</p>"


def _image_section(name: str, path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    img = f"<img alt='{html.escape(name)}' src='data:image/png;base64,{data}'>"
    return _section(path.stem, name, img, drawn=True)


def _section(id_: str, title: str, content: str, drawn: bool | None = None) -> str:
    mark = "" if drawn is None else f" data-drawn={json.dumps(str(drawn).lower())}"
    return f"<section id='{id_}'{mark}><h2>{html.escape(title)}</h2>\n{content}\n</section>"


STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
section { margin: 2em 0; } h2 { border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; } td, th { padding: 2px 10px; text-align: left; }
tr:nth-child(even) { background: #f6f6f6; } code { background: #f2f2f2; padding: 1px 3px; }
pre { white-space: pre-wrap; word-break: break-all; background: #f2f2f2; padding: 6px; }
.none { color: #888; font-style: italic; } img { max-width: 100%; }
"""
