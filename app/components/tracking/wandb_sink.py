"""Weights & Biases through its own library (`pip install -e ".[wandb]"`).

One W&B run per training process and trial: `reinit="create_new"` keeps a sweep's trials that
share a process (Hydra's basic launcher) apart, and close() finishes the run however the
training ended. mode=offline writes under the run dir and needs no account or network;
`wandb sync <dir>/wandb/offline-run-*` uploads it later.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from app.components.tracking import TRACKERS, Tracker
from app.components.tracking.base import COMPLETED, Sink
from app.core.errors import ConfigError
from app.core.fields import one_of

Mode = Literal["offline", "online", "disabled"]
MODES: dict[str, Mode] = {"offline": "offline", "online": "online", "disabled": "disabled"}
WANDB_MODES = tuple(MODES)


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
            mode=MODES[cfg.mode],  # checked: one of them
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

    def config(self, config: Mapping[str, object], plan: Mapping[str, object]) -> None:
        self._run.config.update({**config, "batch_plan": plan}, allow_val_change=True)

    def close(self, summary: Mapping[str, object] | None) -> None:
        status = (summary or {}).get("status")
        if summary:
            self._run.summary.update({k: v for k, v in summary.items() if _plain(v)})
        self._run.finish(exit_code=0 if status == COMPLETED else 1)


def _plain(value: object) -> bool:
    return isinstance(value, str | int | float | bool) or value is None


def _start(cfg: WandbConfig, run_dir: Path, run_name: str, study: str | None) -> Sink:
    return WandbSink(cfg, run_dir, run_name, study)


TRACKERS.add(Tracker("wandb", "wandb", "wandb", WandbConfig, start=_start))
