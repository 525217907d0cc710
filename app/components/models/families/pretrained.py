"""`model.arch=pretrained`: a checkpoint (`model.path`: a local directory or a hub name) with
the head the task asks for (a causal LM, or a classifier for the data's labels)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from app.components.models.families import MODELS, ModelFamily
from app.components.models.pretrained_dir import check_checkpoint

if TYPE_CHECKING:
    from app.components.data.task_data import TaskData
    from app.components.models.config import ModelConfig
    from app.components.models.families import Task


def build(m: ModelConfig, data: TaskData, task: Task) -> Any:
    return task.load_pretrained(m, data)


MODELS.add(
    ModelFamily(
        "pretrained",
        tasks=("causal_lm", "classification"),
        build=build,
        from_config=False,
        check_files=check_checkpoint,
    )
)
