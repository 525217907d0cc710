"""What the sequence-classification families share: the label mapping in the model's config,
the sizes every encoder config takes, and SDPA where the architecture has it (DeBERTa's
disentangled attention has none, so it runs eager)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

from app.core.errors import ConfigError, first_line

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig, PreTrainedModel

    from app.components.data.task_data import TaskData
    from app.components.models.config import ModelConfig

log = logging.getLogger(__name__)
M = TypeVar("M")


class LabelMapping(TypedDict):
    """The head's labels, as a transformers config takes them."""

    num_labels: int
    id2label: dict[int, str]
    label2id: dict[str, int]


def label_mapping(labels: list[str]) -> LabelMapping:
    return {
        "num_labels": len(labels),
        "id2label": dict(enumerate(labels)),
        "label2id": {name: i for i, name in enumerate(labels)},
    }


def encoder_sizes(m: ModelConfig, data: TaskData) -> dict[str, Any]:
    """The config keys every encoder family takes, from model.* and the data's labels."""
    # Any: keywords of the transformers config classes, whose signatures leave out the labels
    # they take through PretrainedConfig's own keywords.
    return {
        "vocab_size": m.vocab_size or data.vocab_size,
        "hidden_size": m.n_embd,
        "num_hidden_layers": m.n_layer,
        "num_attention_heads": m.n_head,
        "intermediate_size": m.intermediate_size or 4 * m.n_embd,
        "max_position_embeddings": m.max_position_embeddings,
        "hidden_dropout_prob": m.dropout,
        "attention_probs_dropout_prob": m.dropout,
        "pad_token_id": data.pad_id,
        **label_mapping(data.info["labels"]),
    }


def build_classifier(class_name: str, config: PretrainedConfig, m: ModelConfig) -> torch.nn.Module:
    """transformers.<class_name> from `config`, untrained, with the attention asked for."""
    import transformers

    from app.components.models.checkpointing import enable_activation_checkpointing

    cls = getattr(transformers, class_name)
    model = with_attention_fallback(
        lambda attn: cls._from_config(config, attn_implementation=attn), m.attn_implementation
    )
    if m.gradient_checkpointing:
        enable_activation_checkpointing(model)
    return model


def with_attention_fallback(make: Callable[[str], M], wanted: str) -> M:
    """make(wanted), or make("eager") when the architecture has no such attention kernel."""
    try:
        return make(wanted)
    except (ValueError, ImportError) as exc:
        if wanted == "eager" or "attention" not in str(exc).lower():
            raise
        log.info("attention %s unsupported here, using eager (%s)", wanted, first_line(exc))
        return make("eager")


def load_pretrained_classifier(m: ModelConfig, data: TaskData) -> torch.nn.Module:
    """A checkpoint with a sequence-classification head for this data's labels (a head for
    other labels is replaced, not refused)."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES as WITH_HEAD,
    )

    path = m.checkpoint()
    try:
        config = AutoConfig.from_pretrained(path, **label_mapping(data.info["labels"]))
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"model.path={m.path!r} could not be loaded ({first_line(exc)})"
        ) from None
    if config.model_type not in WITH_HEAD:
        raise ConfigError(
            f"model.path={m.path!r} is a {config.model_type} model, which has no sequence "
            "classification head in transformers; task=classification needs a classifier or "
            "an encoder (DeBERTa, BERT, RoBERTa, ...)"
        )

    def load(attn: str) -> PreTrainedModel:
        return AutoModelForSequenceClassification.from_pretrained(
            path,
            config=config,
            attn_implementation=attn,
            dtype=torch.float32,
            ignore_mismatched_sizes=True,
        )

    try:
        model = with_attention_fallback(load, m.attn_implementation)
    except Exception as exc:  # unreadable weights, a pickle the safe loader refuses, ...
        raise ConfigError(
            f"model.path={m.path!r} could not be loaded ({first_line(exc)})"
        ) from None
    check_vocab(model, m, data.vocab_size)
    from app.components.models.checkpointing import enable_activation_checkpointing

    if m.gradient_checkpointing:
        enable_activation_checkpointing(model)
    return model


def check_vocab(model: PreTrainedModel, m: ModelConfig, tokenizer_vocab: int) -> None:
    if model.config.vocab_size < tokenizer_vocab:
        raise ConfigError(
            f"model.path={m.path} has vocab_size {model.config.vocab_size} but the tokenizer "
            f"needs {tokenizer_vocab}; use the model's own tokenizer (data.tokenizer={m.path})"
        )
