"""BERT sequence classifiers built from `model.*` sizes, no weights."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.components.models.classifiers import build_classifier, encoder_sizes
from app.components.models.families import MODELS, ModelFamily, Sizes
from app.components.models.heads import SEQUENCE_CLASSIFIER

if TYPE_CHECKING:
    import torch

    from app.components.data.task_data import TaskData
    from app.components.models.config import ModelConfig
    from app.components.models.families import Task


def build(m: ModelConfig, data: TaskData, task: Task) -> torch.nn.Module:
    from transformers import BertConfig

    config = BertConfig(type_vocab_size=2, **encoder_sizes(m, data))
    return build_classifier("BertForSequenceClassification", config, m)


MODELS.add(ModelFamily("bert", build=build, shape=Sizes, heads=(SEQUENCE_CLASSIFIER,)))
