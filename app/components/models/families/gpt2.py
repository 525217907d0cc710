"""GPT-2 (transformers' GPT2LMHeadModel) built from `model.*` sizes, no weights."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.components.models.families import MODELS, ModelFamily, Sizes, causal_lm, model_vocab
from app.components.models.heads import CAUSAL_LM
from app.components.models.mup import Folding, MupRules

if TYPE_CHECKING:
    import torch

    from app.components.data.task_data import TaskData
    from app.components.models.config import ModelConfig
    from app.components.models.families import Task


def parameters(m: ModelConfig, vocab: int) -> int:
    d, h = m.n_embd, ffn(m, m.n_embd)
    # attention qkv + proj (4d^2 + 4d), MLP (2 d h + h + d), two LayerNorms (4d)
    per_layer = 4 * d * d + 4 * d + 2 * d * h + h + d + 4 * d
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


def ffn(m: ModelConfig, width: int) -> int:
    return m.intermediate_size or 4 * width


def fold(state: dict[str, torch.Tensor], f: Folding) -> None:
    """μP into GPT-2's weights: the query third of each fused c_attn, the last LayerNorm."""
    for key in list(state):
        if key.endswith("attn.c_attn.weight"):  # Conv1D: (in, q|k|v)
            state[key] = _scaled(state[key], f.query, (slice(None), slice(0, f.width)))
        elif key.endswith("attn.c_attn.bias"):
            state[key] = _scaled(state[key], f.query, (slice(0, f.width),))
        elif key in ("transformer.ln_f.weight", "transformer.ln_f.bias"):
            state[key] = state[key] * f.output


def _scaled(t: torch.Tensor, factor: float, part: tuple[slice, ...]) -> torch.Tensor:
    out = t.clone()
    out[part] *= factor
    return out


MUP = MupRules(
    attention="GPT2Attention",
    final_norm=lambda model: model.get_submodule("transformer.ln_f"),
    ffn=ffn,
    fold=fold,
)
MODELS.add(
    ModelFamily(
        "gpt2", build=build, shape=Sizes, heads=(CAUSAL_LM,), parameters=parameters, mup=MUP
    )
)
