"""The `model` group: the architecture and its size, or a pretrained checkpoint."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from app.core.errors import ConfigError
from app.core.fields import bounded, fraction, one_of, positive_int

ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# How the width shapes initialization, learning rates and multipliers (docs/training.md, "μP")
PARAMETRIZATIONS = ("standard", "mup")


@dataclass
class MupConfig:
    """model.mup: what model.parametrization=mup reads (app/components/models/mup/)."""

    # The width the hyperparameters are stated at (a proxy's model.n_embd): required under
    # mup, a divisor of model.n_embd; width_mult = model.n_embd / base_width
    base_width: int | None = positive_int(None, nullable=True)
    output_mult: float = bounded(1.0, low=0.0, low_open=True)  # logits x output_mult/width_mult
    # attention scores x attn_mult x sqrt(base_head_dim) / d_head: the standard model's at the
    # base head width, following 1/d_head as the head width grows (null: this model's own head
    # width, the heads scaled with the width as a proxy is: the standard scale at every width)
    base_head_dim: int | None = positive_int(None, nullable=True)
    attn_mult: float = bounded(1.0, low=0.0, low_open=True)


@dataclass
class ModelConfig:
    name: str = MISSING
    arch: str = "gpt2"  # a model family (app/components/models/families/)
    path: str | None = None  # local checkpoint directory (arch=pretrained) or hub name
    vocab_size: int | None = positive_int(None, nullable=True)  # null: the tokenizer's
    n_layer: int = positive_int(2)
    n_head: int = positive_int(4)
    # key/value heads of grouped-query attention, for a family whose shape has it; null = n_head
    n_kv_head: int | None = positive_int(None, nullable=True)
    n_embd: int = positive_int(128)
    # null: the family's own default (4 x n_embd for GPT-2 and the classifiers)
    intermediate_size: int | None = positive_int(None, nullable=True)
    max_position_embeddings: int = positive_int(256)
    dropout: float = fraction(0.0, high_open=True)
    attn_implementation: str = one_of("sdpa", ATTN_IMPLEMENTATIONS)
    gradient_checkpointing: bool = False
    compile: bool | None = None  # null: the gpu preset decides
    compile_mode: str = one_of("default", COMPILE_MODES)
    parametrization: str = one_of("standard", PARAMETRIZATIONS)
    mup: MupConfig = field(default_factory=MupConfig)

    def checkpoint(self) -> str:
        """model.path, where a checkpoint is loaded from (required by the config's check)."""
        if not self.path:
            raise ConfigError(f"model.path is required when model.arch={self.arch}")
        return self.path
