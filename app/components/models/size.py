"""Model sizes from config alone: no torch or transformers, so checks run before they load."""

from __future__ import annotations

from omegaconf import DictConfig


def llama_ffn(hidden: int) -> int:
    # Llama's SwiGLU width: 2/3 of 4h, rounded up to a multiple of 256 for tensor-core shapes.
    return 256 * ((int(8 * hidden / 3) + 255) // 256)


def estimate_parameters(model: DictConfig, vocab: int) -> int | None:
    """Parameters of a model built from config, tied embeddings once (None: pretrained)."""
    d, layers = model.n_embd, model.n_layer
    if model.arch == "gpt2":
        ffn = model.intermediate_size or 4 * d
        # attention qkv + proj (4d^2 + 4d), MLP (2 d ffn + ffn + d), two LayerNorms (4d)
        per_layer = 4 * d * d + 4 * d + 2 * d * ffn + ffn + d + 4 * d
        return vocab * d + model.max_position_embeddings * d + layers * per_layer + 2 * d
    if model.arch == "llama":
        ffn = model.intermediate_size or llama_ffn(d)
        kv = d // model.n_head * (model.n_kv_head or model.n_head)
        # q, o (2d^2), k, v (2 d kv), SwiGLU (3 d ffn), two RMSNorms (2d)
        per_layer = 2 * d * d + 2 * d * kv + 3 * d * ffn + 2 * d
        return vocab * d + layers * per_layer + d
    return None
