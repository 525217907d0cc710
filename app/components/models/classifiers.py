"""Sequence-classification models: built from a transformers config (no weights) or loaded from
a local checkpoint or hub name, with `num_labels` and the label mapping in their config.

`model.arch`: `deberta_v2` (DeBERTa-v3 style: relative position attention, no absolute
positions, no segment embeddings), `bert`, `roberta`, or `pretrained` (`model.path`). SDPA is
used where the architecture has it; DeBERTa's disentangled attention has none, so it runs eager.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from omegaconf import DictConfig

from app.config.validation import ConfigError, first_line

log = logging.getLogger(__name__)
CLASSIFIER_ARCHS = ("deberta_v2", "bert", "roberta")


def build_classifier(
    cfg: DictConfig, vocab_size: int, labels: list[str], pad_id: int
) -> torch.nn.Module:
    mapping = {
        "num_labels": len(labels),
        "id2label": dict(enumerate(labels)),
        "label2id": {name: i for i, name in enumerate(labels)},
    }
    if cfg.arch == "pretrained":
        model = _load_pretrained(cfg, mapping)
        if model.config.vocab_size < vocab_size:
            raise ConfigError(
                f"model.path={cfg.path} has vocab_size {model.config.vocab_size} but the tokenizer "
                f"needs {vocab_size}; use the model's own tokenizer (data.tokenizer={cfg.path})"
            )
    else:
        vocab = cfg.vocab_size or vocab_size
        model = _with_attention(
            _classifier_class(cfg.arch), _config(cfg, vocab, pad_id, mapping), cfg
        )
    if cfg.gradient_checkpointing:
        from app.components.models.build import enable_activation_checkpointing

        enable_activation_checkpointing(model)
    return model


def _config(cfg: DictConfig, vocab: int, pad_id: int, mapping: dict[str, Any]) -> Any:
    common = {
        "vocab_size": vocab,
        "hidden_size": cfg.n_embd,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head,
        "intermediate_size": cfg.intermediate_size or 4 * cfg.n_embd,
        "max_position_embeddings": cfg.max_position_embeddings,
        "hidden_dropout_prob": cfg.dropout,
        "attention_probs_dropout_prob": cfg.dropout,
        "pad_token_id": pad_id,
        **mapping,
    }
    if cfg.arch == "deberta_v2":
        from transformers import DebertaV2Config

        # DeBERTa-v3's attention: relative positions in both directions over log buckets, no
        # absolute position input. Unlike the released checkpoints (type_vocab_size 0), a model
        # trained from scratch gets segment embeddings: on the built-in NLI corpus it learns
        # the pairs about a third faster with them.
        return DebertaV2Config(
            relative_attention=True,
            position_biased_input=False,
            pos_att_type=["p2c", "c2p"],
            max_relative_positions=-1,
            position_buckets=min(256, cfg.max_position_embeddings // 2),
            norm_rel_ebd="layer_norm",
            share_att_key=True,
            type_vocab_size=2,
            **common,
        )
    if cfg.arch == "bert":
        from transformers import BertConfig

        return BertConfig(type_vocab_size=2, **common)
    from transformers import RobertaConfig

    # RoBERTa's positions start after the padding index: room for max_length + 2.
    common["max_position_embeddings"] = cfg.max_position_embeddings + pad_id + 1
    return RobertaConfig(type_vocab_size=1, **common)


def _classifier_class(arch: str) -> Any:
    import transformers

    name = {
        "deberta_v2": "DebertaV2ForSequenceClassification",
        "bert": "BertForSequenceClassification",
        "roberta": "RobertaForSequenceClassification",
    }[arch]
    return getattr(transformers, name)


def _with_attention(cls: Any, config: Any, cfg: DictConfig) -> torch.nn.Module:
    return with_attention_fallback(
        lambda attn: cls._from_config(config, attn_implementation=attn), cfg.attn_implementation
    )


def with_attention_fallback(make: Callable[[str], Any], wanted: str) -> Any:
    """make(wanted), or make("eager") when the architecture has no such attention kernel."""
    try:
        return make(wanted)
    except (ValueError, ImportError) as exc:
        if wanted == "eager" or "attention" not in str(exc).lower():
            raise
        log.info("attention %s unsupported here, using eager (%s)", wanted, first_line(exc))
        return make("eager")


def _load_pretrained(cfg: DictConfig, mapping: dict[str, Any]) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForSequenceClassification
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES as WITH_HEAD,
    )

    try:
        config = AutoConfig.from_pretrained(cfg.path, **mapping)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"model.path={cfg.path!r} could not be loaded ({first_line(exc)})"
        ) from None
    if config.model_type not in WITH_HEAD:
        raise ConfigError(
            f"model.path={cfg.path!r} is a {config.model_type} model, which has no sequence "
            "classification head in transformers; task=classification needs a classifier or "
            "an encoder (DeBERTa, BERT, RoBERTa, ...)"
        )

    def load(attn: str) -> torch.nn.Module:
        return AutoModelForSequenceClassification.from_pretrained(
            cfg.path,
            config=config,
            attn_implementation=attn,
            dtype=torch.float32,
            ignore_mismatched_sizes=True,  # a head for other labels is replaced, not refused
        )

    try:
        return with_attention_fallback(load, cfg.attn_implementation)
    except Exception as exc:  # unreadable weights, a pickle the safe loader refuses, ...
        raise ConfigError(
            f"model.path={cfg.path!r} could not be loaded ({first_line(exc)})"
        ) from None
