"""The bridge between a run and whatever optimizes it.

The loop never imports Optuna: it gets a `Reporter`, calls `report()` at each evaluation and stops
with `Pruned` when told to. Outside a sweep the reporter does nothing. The sweeper names the
reporter's factory in `hpo.reporter` (a dotted path), so nothing here imports the sweeper.

`objectives()` says what a run can be scored on: the summary keys and the metrics reported at
each evaluation, each with the direction that is better. A task extends it through its
`metrics`; the sweeper checks `hpo.metric` and `hpo.report_metric` against it before a trial.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Protocol

from omegaconf import DictConfig

# summary.json keys every run writes that a study may optimize, and which way is better. The
# task adds final_val_<metric> for each of its metrics (app/tasks: Task.metrics).
RUN_METRICS = {
    "tokens_per_sec": "maximize",
    "mfu": "maximize",
    "final_train_loss": "minimize",
    "peak_memory_bytes": "minimize",
    "wall_time_s": "minimize",
}


class Reporter(Protocol):
    def report(self, step: int, metrics: dict[str, float]) -> bool:
        """Record intermediate metrics; return True when the run should stop (pruned)."""
        ...

    def set_attrs(self, attrs: dict[str, Any]) -> None:
        """Attach facts about the run (batch plan, run dir, peak memory) to the trial."""
        ...


class NullReporter:
    def report(self, step: int, metrics: dict[str, float]) -> bool:
        return False

    def set_attrs(self, attrs: dict[str, Any]) -> None:
        pass


def build_reporter(cfg: DictConfig) -> Reporter:
    """The trial's reporter when the sweeper made this run a trial, else a no-op."""
    hpo = cfg.get("hpo")
    if hpo is None or hpo.get("trial_number") is None or not hpo.get("reporter"):
        return NullReporter()
    module, _, name = str(hpo.reporter).rpartition(".")
    return getattr(importlib.import_module(module), name)(cfg)


@dataclass(frozen=True)
class Objectives:
    """What a run can be scored on, with the better direction of each."""

    final: dict[str, str]  # summary.json key -> minimize | maximize
    reported: dict[str, str]  # metric reported at each evaluation -> minimize | maximize


def objectives(cfg: DictConfig) -> Objectives | None:
    """The objectives of a run of `cfg`; None when `cfg` is not a training run's config."""
    task_cfg = cfg.get("task")
    if task_cfg is None:
        return None
    from app.components.tasks import TASKS

    metrics = TASKS[task_cfg.name].metrics
    final = {f"final_val_{m.name}": m.direction for m in metrics}
    # The loop reports val_<name> and final_val_<name> (app/loop.py, _eval_and_report).
    reported = {**{f"val_{m.name}": m.direction for m in metrics}, **final}
    return Objectives(final={**final, **RUN_METRICS}, reported=reported)


def objective_value(summary: dict[str, Any], metric: str | list[str]) -> float | list[float]:
    """The value(s) main() returns: one summary key, or several for multi-objective studies."""
    names = [metric] if isinstance(metric, str) else list(metric)
    values = []
    for name in names:
        if name not in summary:
            raise KeyError(f"objective metric {name!r} is not in summary.json")
        value = summary[name]
        values.append(float("nan") if value is None else float(value))
    return values[0] if isinstance(metric, str) else values
