"""The `task` group: what is learned (app/components/tasks/)."""

from __future__ import annotations

from dataclasses import dataclass

from app.core.errors import ConfigError
from app.core.fields import bounded


@dataclass
class TaskConfig:
    name: str = "causal_lm"
    # classification training loss (evaluation: plain cross-entropy)
    label_smoothing: float = bounded(0.0, low=0.0, high=1.0, high_open=True)
    labels: list[str] | None = None  # classification: label names in id order; null: the data's

    def check(self) -> None:
        """task.labels are the classes' names in id order: a name given twice would map two
        ids to one name (the export's label2id keeps only the last)."""
        if not self.labels:
            return
        names = [str(n) for n in self.labels]
        twice = [n for i, n in enumerate(names) if n in names[:i]]
        if twice:
            raise ConfigError(
                f"task.labels={names} names {twice[0]!r} more than once; allowed: distinct names"
            )
        if len(names) < 2:
            raise ConfigError(f"task.labels={names} names one label; allowed: at least 2")
