"""Weights & Biases through its own library (`pip install -e ".[wandb]"`).

One W&B run per training process and trial: `reinit="create_new"` keeps a sweep's trials that
share a process (Hydra's basic launcher) apart, and close() finishes the run however the
training ended. mode=offline writes under the run dir and needs no account or network;
`wandb sync <dir>/wandb/offline-run-*` uploads it later.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from app.components.tracking import TRACKERS, Tracker
from app.components.tracking.base import COMPLETED, Sink
from app.core.errors import ConfigError
from app.core.fields import one_of

WANDB_MODES = ("offline", "online", "disabled")


@dataclass
class WandbConfig:
    """Weights & Biases (pip extra `wandb`). Offline by default: no account, no network."""

    enabled: bool = False
    project: str = "hydratrain"
    entity: str | None = None
    mode: str = one_of("offline", WANDB_MODES)
    dir: str | None = None  # null: the run dir (W&B writes <dir>/wandb/)
    name: str | None = None  # null: the run dir's last two parts
    group: str | None = None  # null: the study's name under hpo, else none
    tags: list[str] = field(default_factory=list)

    def check(self) -> None:
        if not str(self.project).strip():
            raise ConfigError(f"tracking.wandb.project={self.project!r} must not be empty")


class WandbSink(Sink):
    name = "wandb"

    def __init__(self, cfg: WandbConfig, run_dir: Path, run_name: str, group: str | None) -> None:
        import wandb

        directory = Path(cfg.dir) if cfg.dir else run_dir
        directory.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(
            project=cfg.project,
            entity=cfg.entity,
            mode=cast(Any, cfg.mode),  # one of WANDB_MODES, checked; wandb types it a Literal
            dir=str(directory),
            name=cfg.name or run_name,
            group=cfg.group or group,
            tags=list(cfg.tags) or None,
            reinit="create_new",
        )

    def scalars(self, step: int, values: dict[str, float]) -> None:
        # Several calls at one step (a log window, then an evaluation) merge into one row.
        self._run.log(dict(values), step=step)

    def text(self, tag: str, text: str) -> None:
        self._run.summary[tag] = text

    def config(self, config: dict[str, Any], plan: dict[str, Any]) -> None:
        self._run.config.update({**config, "batch_plan": plan}, allow_val_change=True)

    def close(self, summary: dict[str, Any] | None) -> None:
        status = (summary or {}).get("status")
        if summary:
            self._run.summary.update({k: v for k, v in summary.items() if _plain(v)})
        self._run.finish(exit_code=0 if status == COMPLETED else 1)


def _plain(value: Any) -> bool:
    return isinstance(value, str | int | float | bool) or value is None


def _start(cfg: WandbConfig, run_dir: Path, run_name: str, study: str | None) -> Sink:
    return WandbSink(cfg, run_dir, run_name, study)


TRACKERS.add(Tracker("wandb", "wandb", "wandb", WandbConfig, start=_start))
