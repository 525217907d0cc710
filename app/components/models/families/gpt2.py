"""GPT-2 (transformers' GPT2LMHeadModel) built from `model.*` sizes, no weights."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.components.models.families import MODELS, ModelFamily, Sizes, causal_lm, model_vocab
from app.components.models.heads import CAUSAL_LM

if TYPE_CHECKING:
    import torch

    from app.components.data.task_data import TaskData
    from app.components.models.config import ModelConfig
    from app.components.models.families import Task


def parameters(m: ModelConfig, vocab: int) -> int:
    d, ffn = m.n_embd, m.intermediate_size or 4 * m.n_embd
    # attention qkv + proj (4d^2 + 4d), MLP (2 d ffn + ffn + d), two LayerNorms (4d)
    per_layer = 4 * d * d + 4 * d + 2 * d * ffn + ffn + d + 4 * d
    return vocab * d + m.max_position_embeddings * d + m.n_layer * per_layer + 2 * d


def build(m: ModelConfig, data: TaskData, task: Task) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, GPT2Config

    config = GPT2Config(
        vocab_size=model_vocab(m, data.vocab_size),
        n_positions=m.max_position_embeddings,
        n_embd=m.n_embd,
        n_layer=m.n_layer,
        n_head=m.n_head,
        n_inner=m.intermediate_size,
        resid_pdrop=m.dropout,
        embd_pdrop=m.dropout,
        attn_pdrop=m.dropout,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = AutoModelForCausalLM.from_config(config, attn_implementation=m.attn_implementation)
    return causal_lm(model, m)


MODELS.add(ModelFamily("gpt2", build=build, shape=Sizes, heads=(CAUSAL_LM,), parameters=parameters))
