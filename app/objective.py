"""The bridge between a run and whatever optimizes it.

The loop never imports Optuna: it gets a `Reporter`, calls `report()` at each evaluation and stops
with `Pruned` when told to. Outside a sweep the reporter does nothing.
"""

from __future__ import annotations

from typing import Any, Protocol

from omegaconf import DictConfig


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
    """The trial's reporter when this run is an HPO trial, else a no-op."""
    if cfg.get("hpo") is None:
        return NullReporter()
    from hydra_plugins.hydratrain_optuna_sweeper.reporter import reporter_for_job

    return reporter_for_job(cfg)


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
