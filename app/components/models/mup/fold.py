"""A μP model as a standard one, for an export that transformers loads alone: the attention scale
folded into the query projections (scores x s = (q x s sqrt(d_head)) . k / sqrt(d_head), s =
attn_mult sqrt(base head width) / d_head), the logits' multiplier into the last norm's gain and
bias (the readout reads only it). The tied embedding matrix stays as trained: the input
embeddings read it too."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

from app.components.models.mup import MupRules, base_head_dim, folding

if TYPE_CHECKING:
    import torch

    from app.components.models.config import ModelConfig


def exported_weights(
    model: torch.nn.Module,
    m: ModelConfig,
    rules: MupRules,
    weights: Mapping[str, object] | None = None,
) -> dict[str, torch.Tensor]:
    """What the export of a μP model writes: its state (`weights`, else the model's own) with
    its multipliers folded in; the model is untouched."""
    source = weights if weights is not None else model.state_dict()
    state = cast("dict[str, torch.Tensor]", dict(source))  # a copy: the fold replaces entries
    rules.fold(state, folding(m, rules))
    return state


def export_record(m: ModelConfig) -> dict[str, object]:
    """What the export's marker says of how the model was trained."""
    if m.parametrization != "mup":
        return {"parametrization": "standard"}
    return {
        "parametrization": "mup",
        "base_width": m.mup.base_width,
        "output_mult": m.mup.output_mult,
        "base_head_dim": base_head_dim(m),  # resolved: the head width its attention is stated at
        "attn_mult": m.mup.attn_mult,
        "folded": "the attention scale into the query projections, the logits' multiplier into "
        "the last norm: a standard model",
    }
