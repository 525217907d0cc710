"""μP, the Maximal Update Parametrization (`model.parametrization=mup`; Yang et al. 2022,
"Tensor Programs V: Tuning Large Neural Networks via Zero-Shot Hyperparameter Transfer"): the
learning rate, initialization and multipliers tuned at `model.mup.base_width` hold at any width
it divides. With width_mult = width / base width (a hidden matrix's own: its fan-in over the
base model's), by parameter kind (docs/training.md, "μP"):

- input-like (token and position embeddings, and so the tied readout's matrix), biases and norm
  gains: initialization and learning rate as under the standard parametrization;
- hidden matrices (attention and MLP projections): initial std / sqrt(width_mult) (variance
  ∝ 1/fan_in: the standard model's at the base width), learning rate / width_mult (AdamW, Lion;
  Adafactor, whose step is relative to the weight's RMS: / sqrt(width_mult)) and weight decay
  x the same, so that lr x weight_decay, the decay per step, is unchanged (app/components/optim);
- the logits: x output_mult / width_mult, applied to the last norm's output (what the readout
  reads: the same product, and the embedding matrix the readout shares stays one matrix);
- attention scores: x attn_mult x sqrt(base_head_dim) / d_head instead of 1 / sqrt(d_head):
  1/d_head as the head width grows from the base model's (`model.mup.base_head_dim`), the
  constant such that the base model's attention is the standard one (`attention_scale`).

A family opts in with `MupRules` (its attention modules, its last norm, its MLP width, how an
export folds the multipliers into its weights); `apply.py` applies them when a model is built,
`fold.py` when it is exported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.core.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from app.components.models.config import ModelConfig


@dataclass(frozen=True)
class Folding:
    """The multipliers an export folds into a standard model's weights."""

    width: int  # model.n_embd (where a fused projection's query part ends)
    query: float  # x the query projection: attention_scale(...) / (1 / sqrt(d_head))
    output: float  # x the last norm's gain (and bias): output_mult / width_mult


@dataclass(frozen=True)
class MupRules:
    """What μP needs of a family, by its own modules' names."""

    attention: (
        str  # the class name of its attention modules (app/components/models/mup/attention.py)
    )
    final_norm: Callable[[torch.nn.Module], torch.nn.Module]  # the norm the readout reads
    ffn: Callable[[ModelConfig, int], int]  # the MLP's inner width at a model width
    # Fold the multipliers into a state dict (in place, on tensors of its own)
    fold: Callable[[dict[str, torch.Tensor], Folding], None]


@dataclass(frozen=True)
class Widths:
    """The model's widths and its base model's: what a hidden matrix's multiplier is."""

    width: int
    base: int
    ffn: int
    base_ffn: int

    @property
    def mult(self) -> float:
        """width_mult of the residual stream: the logits' and most matrices' divisor."""
        return self.width / self.base

    def of_fan_in(self, fan_in: int) -> float:
        """A hidden matrix's width multiplier: its fan-in over the base model's."""
        if fan_in == self.width:
            return self.width / self.base
        if fan_in == self.ffn:
            return self.ffn / self.base_ffn
        raise ValueError(
            f"a hidden matrix of fan-in {fan_in} is neither the width {self.width} nor the MLP's "
            f"{self.ffn}: μP cannot tell its base"
        )


def widths(m: ModelConfig, rules: MupRules) -> Widths:
    base = base_width(m)
    return Widths(m.n_embd, base, rules.ffn(m, m.n_embd), rules.ffn(m, base))


def base_width(m: ModelConfig) -> int:
    if m.mup.base_width is None:  # refused by the config's check; a caller that skipped it
        raise ConfigError("model.mup.base_width is required with model.parametrization=mup")
    return m.mup.base_width


def attention_scale(m: ModelConfig, head_dim: int) -> float:
    """μP's scale of the attention scores at a head width: attn_mult x sqrt(base) / head_dim.

    μP's rule is how the scale changes as the head width grows (as 1/d_head, so that the
    scores, whose query and key move together, stay the size they are); the constant is free,
    and this one makes the base model's attention the standard 1/sqrt(d_head). The base head
    width is model.mup.base_head_dim, or, null, this model's own: with the heads scaled with
    the width (a fixed head width, as a proxy scales them) μP's attention is then the standard
    one at every width, attn_mult a multiplier on it."""
    return m.mup.attn_mult * base_head_dim(m) ** 0.5 / head_dim


def base_head_dim(m: ModelConfig) -> int:
    """The head width μP's attention is stated at (model.mup.base_head_dim, null: this
    model's own)."""
    return m.mup.base_head_dim if m.mup.base_head_dim is not None else m.n_embd // m.n_head


def folding(m: ModelConfig, rules: MupRules) -> Folding:
    head_dim = m.n_embd // m.n_head
    return Folding(
        width=m.n_embd,
        query=attention_scale(m, head_dim) * head_dim**0.5,
        output=m.mup.output_mult / widths(m, rules).mult,
    )


def check_base_width(m: ModelConfig) -> None:
    """model.mup.base_width: set, at most the width, and a divisor of it."""
    width, base = m.n_embd, m.mup.base_width
    divisors = ", ".join(str(k) for k in range(1, width + 1) if width % k == 0)
    if base is None:
        raise ConfigError(
            "model.mup.base_width is required with model.parametrization=mup (the width the "
            f"hyperparameters are stated at, e.g. the proxy's model.n_embd); allowed: a divisor "
            f"of model.n_embd={width}: {divisors}"
        )
    if base > width or width % base:
        raise ConfigError(
            f"model.mup.base_width={base} must divide model.n_embd={width} and be at most it; "
            f"allowed: {divisors}"
        )
