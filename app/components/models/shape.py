"""What a built model is, for the FLOPs formula."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass
class ModelShape:
    """What the FLOPs formula needs: 6N + 12 * n_layer * n_head * head_dim * seq_len per token."""

    num_params: int  # N: all parameters except position embeddings, tied weights once
    n_layer: int
    n_head: int
    head_dim: int


def model_shape(model: torch.nn.Module) -> ModelShape:
    from transformers import PretrainedConfig

    config = model.config
    if not isinstance(config, PretrainedConfig):
        raise TypeError(f"{type(model).__name__} has no transformers config to size it by")
    seen: set[int] = set()
    n = 0
    for name, p in model.named_parameters():
        if id(p) in seen or "wpe" in name.split("."):  # learned positions add no matmul FLOPs
            continue
        seen.add(id(p))
        n += p.numel()
    n_head = config.num_attention_heads
    return ModelShape(n, config.num_hidden_layers, n_head, config.hidden_size // n_head)
