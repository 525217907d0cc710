"""Tasks: the one place a task's name is turned into its implementation (see base.py)."""

from __future__ import annotations

from omegaconf import DictConfig

from app.components.tasks.base import Metric, Task, TaskData
from app.components.tasks.causal_lm import CausalLM
from app.components.tasks.classification import SequenceClassification

TASKS: dict[str, type] = {"causal_lm": CausalLM, "classification": SequenceClassification}

__all__ = ["TASKS", "Metric", "Task", "TaskData", "build_task"]


def build_task(task_cfg: DictConfig | None) -> Task:
    """The task a config names (causal LM when it names none: configs older than tasks)."""
    name = "causal_lm" if task_cfg is None else task_cfg.name
    return TASKS[name](task_cfg)
