"""A causal LM checkpoint (`model.arch=pretrained` with task=causal_lm): transformers'
AutoModelForCausalLM, loaded in fp32 (autocast does the rest)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.components.models.classifiers import check_vocab
from app.components.models.families import causal_lm
from app.core.errors import ConfigError, first_line

if TYPE_CHECKING:
    import torch

    from app.components.models.config import ModelConfig


def load_pretrained_lm(m: ModelConfig, tokenizer_vocab: int) -> torch.nn.Module:
    import torch
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(
            m.checkpoint(), attn_implementation=m.attn_implementation, dtype=torch.float32
        )
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"model.path={m.path!r} could not be loaded as a causal LM ({first_line(exc)})"
        ) from exc
    check_vocab(model, m, tokenizer_vocab)
    return causal_lm(model, m)
