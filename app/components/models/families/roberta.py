"""RoBERTa sequence classifiers built from `model.*` sizes, no weights."""

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
    from transformers import RobertaConfig

    sizes = encoder_sizes(m, data)
    # RoBERTa's positions start after the padding index: room for max_length + 2.
    # classification data always has a padding id (app/components/data/labelled/texts.py)
    pad = data.pad_id or 0
    sizes["max_position_embeddings"] = m.max_position_embeddings + pad + 1
    # Two token types, as BERT's: text pairs come with the second segment's ids set to 1 (the
    # released checkpoints have one type, and their tokenizer sets none: model=pretrained).
    return build_classifier(
        "RobertaForSequenceClassification", RobertaConfig(type_vocab_size=2, **sizes), m
    )


MODELS.add(ModelFamily("roberta", build=build, shape=Sizes, heads=(SEQUENCE_CLASSIFIER,)))
