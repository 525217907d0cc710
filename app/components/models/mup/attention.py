"""The attention scale of a transformers model: the one place this project sets what
transformers does not offer as a setting.

Neither GPT2Config nor LlamaConfig has a field for the scale of the attention scores (GPT-2's
`scale_attn_weights` only turns 1/sqrt(d_head) on or off). Their attention modules
(GPT2Attention, LlamaAttention in transformers 5.x) hold it as the attribute `scaling`, set to
1/sqrt(head_dim) when built, and hand it to every attention implementation (eager, sdpa, flash,
flex) as `scaling=`. μP sets it here (`attention_scale`: attn_mult x sqrt(base head width) /
head_dim); tests/test_mup.py checks that the
scores a model computes follow the value set (a transformers that stopped reading it would
fail there, not train silently at the standard scale).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, cast

if TYPE_CHECKING:
    import torch


class Scaled(Protocol):
    """What GPT2Attention and LlamaAttention hold: the scale they pass as `scaling=`."""

    scaling: float
    head_dim: int


def set_attention_scale(
    model: torch.nn.Module, attention: str, scale: Callable[[int], float]
) -> int:
    """`scale(head_dim)` on every module of class `attention`; returns how many."""
    found = attention_modules(model, attention)
    for module in found:
        if not isinstance(module.scaling, float) or not isinstance(module.head_dim, int):
            raise TypeError(f"{attention} has no float `scaling` and int `head_dim` to set")
        module.scaling = scale(module.head_dim)
    if not found:
        raise TypeError(f"no {attention} module in {type(model).__name__}: μP cannot set its scale")
    return len(found)


def attention_modules(model: torch.nn.Module, attention: str) -> list[Scaled]:
    """The modules of class `attention`, as what they hold."""
    return [cast(Scaled, m) for m in model.modules() if type(m).__name__ == attention]
