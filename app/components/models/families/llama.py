"""Llama (transformers' LlamaForCausalLM) built from `model.*` sizes, no weights: RMSNorm,
SwiGLU, rotary positions, grouped-query attention (`model.n_kv_head`), tied embeddings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.components.models.families import MODELS, ModelFamily, causal_lm, model_vocab
from app.components.models.heads import CAUSAL_LM
from app.components.models.mup import Folding, MupRules

if TYPE_CHECKING:
    import torch

    from app.components.data.task_data import TaskData
    from app.components.models.config import ModelConfig
    from app.components.models.families import Task


@dataclass(frozen=True)
class LlamaShape:
    """GPT-2's sizes and the key/value heads of grouped-query attention."""

    vocab_size: int | None
    n_layer: int
    n_head: int
    n_kv_head: int | None
    n_embd: int
    intermediate_size: int | None
    max_position_embeddings: int


def ffn_width(hidden: int) -> int:
    # Llama's SwiGLU width: 2/3 of 4h, rounded up to a multiple of 256 for tensor-core shapes.
    return 256 * ((int(8 * hidden / 3) + 255) // 256)


def parameters(m: ModelConfig, vocab: int) -> int:
    d, h = m.n_embd, ffn(m, m.n_embd)
    kv = d // m.n_head * (m.n_kv_head or m.n_head)
    # q, o (2d^2), k, v (2 d kv), SwiGLU (3 d h), two RMSNorms (2d)
    per_layer = 2 * d * d + 2 * d * kv + 3 * d * h + 2 * d
    return vocab * d + m.n_layer * per_layer + d


def build(m: ModelConfig, data: TaskData, task: Task) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=model_vocab(m, data.vocab_size),
        hidden_size=m.n_embd,
        intermediate_size=ffn(m, m.n_embd),
        num_hidden_layers=m.n_layer,
        num_attention_heads=m.n_head,
        num_key_value_heads=m.n_kv_head or m.n_head,
        max_position_embeddings=m.max_position_embeddings,
        attention_dropout=m.dropout,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=None,
        tie_word_embeddings=True,
    )
    model = AutoModelForCausalLM.from_config(config, attn_implementation=m.attn_implementation)
    return causal_lm(model, m)


def ffn(m: ModelConfig, width: int) -> int:
    return m.intermediate_size or ffn_width(width)


def fold(state: dict[str, torch.Tensor], f: Folding) -> None:
    """μP into Llama's weights: each query projection (rotary positions are linear in the
    query: a factor passes through them), the last RMSNorm's gain."""
    for key in list(state):
        if key.endswith(("self_attn.q_proj.weight", "self_attn.q_proj.bias")):
            state[key] = state[key] * f.query
        elif key == "model.norm.weight":
            state[key] = state[key] * f.output


MUP = MupRules(
    attention="LlamaAttention",
    final_norm=lambda model: model.get_submodule("model.norm"),
    ffn=ffn,
    fold=fold,
)
MODELS.add(
    ModelFamily(
        "llama",
        build=build,
        shape=LlamaShape,
        heads=(CAUSAL_LM,),
        parameters=parameters,
        mup=MUP,
    )
)
