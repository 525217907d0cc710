"""`model.arch=pretrained`: a checkpoint (`model.path`: a local directory or a hub name) with
the head the task asks for (a causal LM, or a classifier for the data's labels)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.components.models.families import MODELS, Checkpoint, ModelFamily
from app.components.models.pretrained_dir import check_checkpoint

if TYPE_CHECKING:
    import torch

    from app.components.data.task_data import TaskData
    from app.components.models.config import ModelConfig
    from app.components.models.families import Task


def build(m: ModelConfig, data: TaskData, task: Task) -> torch.nn.Module:
    return task.load_pretrained(m, data)


MODELS.add(
    ModelFamily(
        "pretrained",
        build=build,
        shape=Checkpoint,
        loads_checkpoint=True,
        check_files=check_checkpoint,
    )
)
