"""What a model family asks of the task it builds a model for (app/components/tasks): the seam
the families, the pretrained checks and the tasks share."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from app.components.data.config import DataConfig
    from app.components.data.task_data import TaskData
    from app.components.models.config import ModelConfig


class Task(Protocol):
    """What a model family asks of the task it builds a model for (app/components/tasks)."""

    @property
    def name(self) -> str: ...

    @property
    def sequence_setting(self) -> str: ...

    @property
    def byte_vocab(self) -> int: ...

    def sequence_length(self, data: DataConfig) -> int: ...

    def load_pretrained(self, model: ModelConfig, data: TaskData) -> torch.nn.Module: ...
