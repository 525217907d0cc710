"""Tasks (`task.name`), one module each behind one interface (base.py): causal LM, sequence
classification."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core.registry import Registry

if TYPE_CHECKING:
    from app.components.tasks.base import Task
    from app.components.tasks.config import TaskConfig

TASKS: Registry[type[Task]] = Registry(__name__, "task.name")


def build_task(cfg: TaskConfig) -> Task:
    return TASKS.get(cfg.name)(cfg)
