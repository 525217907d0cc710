"""Build the causal LM: from a transformers config (no weights) or a local checkpoint."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from omegaconf import DictConfig

from app.config.schema import ConfigError
from app.components.models.size import llama_ffn
from app.config.validation import first_line

log = logging.getLogger(__name__)


@dataclass
class ModelShape:
    """What the FLOPs formula needs: 6N + 12 * n_layer * n_head * head_dim * seq_len per token."""

    num_params: int  # N: all parameters except position embeddings, tied weights once
    n_layer: int
    n_head: int
    head_dim: int


def build_model(cfg: DictConfig, vocab_size: int) -> torch.nn.Module:
    if cfg.arch == "pretrained":
        model = _load_pretrained(cfg)
        if model.config.vocab_size < vocab_size:
            raise ConfigError(
                f"model.path={cfg.path} has vocab_size {model.config.vocab_size} but the tokenizer "
                f"needs {vocab_size}; use the model's own tokenizer (data.tokenizer={cfg.path})"
            )
    else:
        model = _from_config(cfg, _model_vocab(cfg, vocab_size))
    if cfg.gradient_checkpointing:
        enable_activation_checkpointing(model)
    model.config.use_cache = False  # no KV cache while training: it only costs memory
    return model


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    kwargs = {"use_reentrant": False}  # the reentrant variant is deprecated in torch
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5 renamed it
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _model_vocab(cfg: DictConfig, tokenizer_vocab: int) -> int:
    if cfg.vocab_size is None:
        return tokenizer_vocab
    if cfg.vocab_size < tokenizer_vocab:
        raise ConfigError(
            f"model.vocab_size={cfg.vocab_size} is smaller than the tokenizer's {tokenizer_vocab}; "
            f"use model.vocab_size>={tokenizer_vocab} or null"
        )
    return cfg.vocab_size


def _from_config(cfg: DictConfig, vocab: int) -> torch.nn.Module:
    if cfg.arch == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(
            vocab_size=vocab,
            n_positions=cfg.max_position_embeddings,
            n_embd=cfg.n_embd,
            n_layer=cfg.n_layer,
            n_head=cfg.n_head,
            n_inner=cfg.intermediate_size,
            resid_pdrop=cfg.dropout,
            embd_pdrop=cfg.dropout,
            attn_pdrop=cfg.dropout,
            bos_token_id=0,
            eos_token_id=0,
            attn_implementation=cfg.attn_implementation,
        )
        return GPT2LMHeadModel(config)
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=cfg.n_embd,
        intermediate_size=cfg.intermediate_size or llama_ffn(cfg.n_embd),
        num_hidden_layers=cfg.n_layer,
        num_attention_heads=cfg.n_head,
        num_key_value_heads=cfg.n_kv_head or cfg.n_head,
        max_position_embeddings=cfg.max_position_embeddings,
        attention_dropout=cfg.dropout,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=None,
        tie_word_embeddings=True,
        attn_implementation=cfg.attn_implementation,
    )
    return LlamaForCausalLM(config)


def _load_pretrained(cfg: DictConfig) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(
            cfg.path, attn_implementation=cfg.attn_implementation, dtype=torch.float32
        )
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"model.path={cfg.path!r} could not be loaded as a causal LM ({first_line(exc)})"
        ) from exc


def model_shape(model: torch.nn.Module) -> ModelShape:
    config = model.config
    seen: set[int] = set()
    n = 0
    for name, p in model.named_parameters():
        if id(p) in seen or "wpe" in name.split("."):  # learned positions add no matmul FLOPs
            continue
        seen.add(id(p))
        n += p.numel()
    n_head = config.num_attention_heads
    return ModelShape(n, config.num_hidden_layers, n_head, config.hidden_size // n_head)


def maybe_compile(model: torch.nn.Module, mcfg: DictConfig, preset: DictConfig) -> torch.nn.Module:
    wanted = preset.compile if mcfg.compile is None else mcfg.compile
    if not wanted:
        return model
    return torch.compile(model, mode=mcfg.compile_mode)
