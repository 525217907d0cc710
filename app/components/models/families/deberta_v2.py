"""DeBERTa-v2/v3 sequence classifiers built from `model.*` sizes, no weights."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from app.components.models.classifiers import build_classifier, encoder_sizes
from app.components.models.families import MODELS, ModelFamily, Sizes
from app.components.models.heads import SEQUENCE_CLASSIFIER

if TYPE_CHECKING:
    import torch

    from app.components.data.task_data import TaskData
    from app.components.models.config import ModelConfig
    from app.components.models.families import Task


def build(m: ModelConfig, data: TaskData, task: Task) -> torch.nn.Module:
    from transformers import DebertaV2Config

    # DeBERTa-v3's attention: relative positions in both directions over log buckets, no
    # absolute position input. Unlike the released checkpoints (type_vocab_size 0), a model
    # trained from scratch gets segment embeddings: on the built-in NLI corpus it learns the
    # pairs about a third faster with them.
    # Options DebertaV2 reads from its config's extra keywords (not in its signature).
    v3: dict[str, Any] = {
        "position_buckets": min(256, m.max_position_embeddings // 2),
        "norm_rel_ebd": "layer_norm",
        "share_att_key": True,
    }
    config = DebertaV2Config(
        relative_attention=True,
        position_biased_input=False,
        pos_att_type=["p2c", "c2p"],
        max_relative_positions=-1,
        type_vocab_size=2,
        **v3,
        **encoder_sizes(m, data),
    )
    return build_classifier("DebertaV2ForSequenceClassification", config, m)


MODELS.add(ModelFamily("deberta_v2", build=build, shape=Sizes, heads=(SEQUENCE_CLASSIFIER,)))
