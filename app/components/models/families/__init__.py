"""Model families (`model.arch`), one module each: GPT-2 and Llama causal LMs, DeBERTa-v2,
BERT and RoBERTa classifiers built from `model.*` sizes, and `pretrained` checkpoints.

A family says which tasks it has a head for, how many parameters a config of it has (for the
memory preflight, before anything is built) and how to build it. Building imports transformers,
so it waits until a run needs the model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from app.core.errors import ConfigError
from app.core.registry import Registry

if TYPE_CHECKING:
    import torch

    from app.components.data.config import DataConfig
    from app.components.data.task_data import TaskData
    from app.components.models.config import ModelConfig


class Task(Protocol):
    """What a model family asks of the task it builds a model for (app/components/tasks)."""

    @property
    def name(self) -> str: ...

    @property
    def sequence_setting(self) -> str: ...

    @property
    def byte_vocab(self) -> int: ...

    def sequence_length(self, data: DataConfig) -> int: ...

    def load_pretrained(self, model: ModelConfig, data: TaskData) -> torch.nn.Module: ...


Build = Callable[["ModelConfig", "TaskData", Task], "torch.nn.Module"]


def _unknown(m: ModelConfig, vocab: int) -> int | None:
    return None


def _no_files(m: ModelConfig, data: DataConfig, task: Task) -> None:
    return None


@dataclass(frozen=True)
class ModelFamily:
    name: str  # model.arch=NAME
    tasks: tuple[str, ...]  # the tasks it has a head for
    build: Build  # (its config, the task's data, the task) -> the model, untrained or loaded
    # Parameters of a config of it, tied embeddings once (None: known only once loaded)
    parameters: Callable[[ModelConfig, int], int | None] = _unknown
    from_config: bool = True  # sized by model.*; False: a checkpoint (model.path)
    # What its files must hold, checked before any work (a checkpoint's positions, vocabulary)
    check_files: Callable[[ModelConfig, DataConfig, Task], None] = _no_files

    def check(self, m: ModelConfig, sequence_key: str, sequence: int) -> None:
        """What the config alone can show: heads that divide the width, positions that cover
        the sequence (`data.<sequence_key>`), a path where a checkpoint is loaded."""
        if not self.from_config:
            if not m.path:
                raise ConfigError(f"model.path is required when model.arch={self.name}")
            return
        if m.n_embd % m.n_head:
            raise ConfigError(
                f"model.n_embd={m.n_embd} must be divisible by model.n_head={m.n_head} "
                f"(allowed n_head: {', '.join(str(h) for h in _divisors(m.n_embd))})"
            )
        if m.n_kv_head is not None and m.n_head % m.n_kv_head:
            raise ConfigError(f"model.n_kv_head={m.n_kv_head} must divide model.n_head={m.n_head}")
        if sequence > m.max_position_embeddings:
            raise ConfigError(
                f"data.{sequence_key}={sequence} exceeds model.max_position_embeddings="
                f"{m.max_position_embeddings}; use data.{sequence_key}<={m.max_position_embeddings}"
            )


MODELS: Registry[ModelFamily] = Registry(__name__, "model.arch")


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, min(n, 64) + 1) if n % k == 0]


def model_vocab(m: ModelConfig, tokenizer_vocab: int) -> int:
    """model.vocab_size, or the tokenizer's; never fewer ids than the tokenizer makes."""
    if m.vocab_size is None:
        return tokenizer_vocab
    if m.vocab_size < tokenizer_vocab:
        raise ConfigError(
            f"model.vocab_size={m.vocab_size} is smaller than the tokenizer's {tokenizer_vocab}; "
            f"use model.vocab_size>={tokenizer_vocab} or null"
        )
    return m.vocab_size


def causal_lm(model: Any, m: ModelConfig) -> Any:
    """What every causal LM gets: activation checkpointing if asked, no KV cache."""
    if m.gradient_checkpointing:
        enable_activation_checkpointing(model)
    model.config.use_cache = False  # no KV cache while training: it only costs memory
    return model


def enable_activation_checkpointing(model: Any) -> None:
    kwargs = {"use_reentrant": False}  # the reentrant variant is deprecated in torch
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5 renamed it
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
