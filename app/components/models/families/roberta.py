"""RoBERTa sequence classifiers built from `model.*` sizes, no weights."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from app.components.models.classifiers import build_classifier, encoder_sizes
from app.components.models.families import MODELS, ModelFamily

if TYPE_CHECKING:
    from app.components.models.config import ModelConfig
    from app.components.tasks.base import Task, TaskData


def build(m: ModelConfig, data: TaskData, task: Task) -> Any:
    from transformers import RobertaConfig

    sizes = encoder_sizes(m, data)
    # RoBERTa's positions start after the padding index: room for max_length + 2.
    sizes["max_position_embeddings"] = m.max_position_embeddings + data.pad_id + 1
    return build_classifier(
        "RobertaForSequenceClassification", RobertaConfig(type_vocab_size=1, **sizes), m
    )


MODELS.add(ModelFamily("roberta", tasks=("classification",), build=build))
