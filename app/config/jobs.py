"""What the sweeper asks of a job config it composed: is it a training run's, and does it pass
the app's checks, and where its trial reports."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from app.config.budget import ReportAxis, report_axis
from app.config.schema import TrainConfig, load_config


def task_of(cfg: DictConfig) -> str | None:
    """The task a composed job config trains; None when it is not a training run's config (a
    sweep of another app through this sweeper)."""
    task = cfg.get("task")
    return None if task is None else str(task.name)


def check_job_config(cfg: DictConfig) -> None:
    """A training job's config through the app's own checks (ConfigError); any other app's
    config passes untouched."""
    if OmegaConf.get_type(cfg) is TrainConfig:
        load_config(cfg)


def report_axis_of(cfg: object) -> ReportAxis | None:
    """Where a training job's trial reports (steps, or the data seen under a data budget) and
    its budget on that axis: what the pruners place their rungs on. None for another app's
    config. `cfg`: a composed DictConfig, or the app's typed config."""
    if isinstance(cfg, DictConfig):
        if OmegaConf.get_type(cfg) is not TrainConfig:
            return None
        cfg = load_config(cfg)
    if not isinstance(cfg, TrainConfig):
        return None
    return report_axis(cfg.training, cfg.tokens_per_sample())
