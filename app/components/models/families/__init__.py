"""Model families (`model.arch`), one module each: causal LMs and classifiers built from
`model.*` sizes (such as gpt2), and checkpoints loaded with the task's head (`pretrained`).

A family registers a `ModelFamily` saying what it provides: the heads it builds
(app/components/models/heads.py), or that it loads a checkpoint with whatever head the task
asks for; which `model.*` settings shape it (its `shape`, a dataclass of ModelConfig fields: a
checkpoint resumes only into the same); how many parameters a config of it has (for the memory
preflight, before anything is built) and how to build it. Building imports transformers, so it
waits until a run needs the model. A sized family comes with a `conf/model/<name>.yaml` to
choose it by.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.components.models.checkpointing import enable_activation_checkpointing
from app.components.models.config import ModelConfig
from app.components.models.heads import Head
from app.components.models.mup import MupRules, check_base_width
from app.components.models.task import Task
from app.core.errors import ConfigError
from app.core.registry import Registry

if TYPE_CHECKING:
    import torch
    from _typeshed import DataclassInstance
    from transformers import PreTrainedModel

    from app.components.data.config import DataConfig
    from app.components.data.task_data import TaskData
    from app.components.optim import HiddenMatrices


Build = Callable[[ModelConfig, "TaskData", Task], "torch.nn.Module"]


@dataclass(frozen=True)
class Sizes:
    """The model.* settings that shape a model built from sizes (GPT-2, the classifiers)."""

    vocab_size: int | None
    n_layer: int
    n_head: int
    n_embd: int
    intermediate_size: int | None
    max_position_embeddings: int


@dataclass(frozen=True)
class Checkpoint:
    """What shapes a loaded checkpoint: which one it is (its head comes from the task)."""

    path: str | None


def _unknown(m: ModelConfig, vocab: int) -> int | None:
    return None


def _no_files(m: ModelConfig, data: DataConfig, task: Task) -> None:
    return None


@dataclass(frozen=True)
class ModelFamily:
    """One `model.arch`: what a family module registers. Each field is a question a new family
    answers (the default in brackets):

    - `name`: what model.arch calls it (the module is `<name>.py`).
    - `build(model, data, task)`: the model, untrained or loaded; transformers imported here.
    - `shape`: a dataclass whose fields are the ModelConfig fields that shape it (`Sizes` for
      a plain transformer, with `n_kv_head` for grouped-query attention): a checkpoint resumes
      only into a run with the same values, and a name that is no ModelConfig field fails.
    - `heads` [none]: the heads it builds from model.* sizes; a task whose head is not among
      them is refused in one line naming the families that have it.
    - `loads_checkpoint` [False]: it loads model.path with whatever head the task asks for
      (Task.load_pretrained) rather than building from sizes.
    - `parameters(model, vocab)` [unknown]: the parameters a config of it has, tied embeddings
      counted once, as the built model has them (the memory preflight refuses a model that
      cannot fit before anything is built; tests/test_registration.py compares it with the
      built model for every family with a conf/model file); None: known only once loaded.
    - `check_files(model, data, task)` [nothing]: what its files must hold, checked before any
      work (a checkpoint's positions, its vocabulary).
    """

    name: str
    build: Build
    shape: type[DataclassInstance]
    heads: tuple[Head, ...] = ()
    loads_checkpoint: bool = False
    parameters: Callable[[ModelConfig, int], int | None] = _unknown
    check_files: Callable[[ModelConfig, DataConfig, Task], None] = _no_files
    mup: MupRules | None = None  # μP's rules for it (None: model.parametrization=mup refused)

    def __post_init__(self) -> None:
        known = {f.name: f.type for f in dataclasses.fields(ModelConfig)}
        for f in dataclasses.fields(self.shape):
            if known.get(f.name) != f.type:
                raise TypeError(
                    f"model family {self.name}: its shape field {f.name}: {f.type} is not a "
                    "field of ModelConfig of that type"
                )

    def builds(self, head: Head) -> bool:
        """Whether a model of it can have this head (a task's `head`)."""
        return self.loads_checkpoint or head in self.heads

    def shape_keys(self) -> tuple[str, ...]:
        """The settings a checkpoint of it must share with the run that resumes it."""
        return ("model.arch", *(f"model.{f.name}" for f in dataclasses.fields(self.shape)))

    def check(self, m: ModelConfig, sequence_key: str, sequence: int) -> None:
        """What the config alone can show: heads that divide the width, positions that cover
        the sequence (`data.<sequence_key>`), a path where a checkpoint is loaded, μP where
        it has the rules."""
        if m.parametrization == "mup":
            self.mup_rules(m)
        if self.loads_checkpoint:
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

    def mup_rules(self, m: ModelConfig) -> MupRules:
        """Its μP rules, for a config that asks for them: refused in one line where it has none
        or the base width does not fit the width."""
        if self.loads_checkpoint:
            raise ConfigError(
                f"model.parametrization=mup with model.arch={self.name}: μP's rules start from "
                "their own initialization, and a checkpoint's weights were not trained under them "
                "(an export of a μP run has its multipliers folded in: a standard model); use "
                "model.parametrization=standard, or resume the μP run (training.resume)"
            )
        if self.mup is None:
            able = ", ".join(f.name for f in MODELS.all() if f.mup is not None)
            raise ConfigError(
                f"model.parametrization=mup: model.arch={self.name} has no μP rules; use "
                f"model.parametrization=standard, or one of: {able}"
            )
        check_base_width(m)
        return self.mup


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


def mup_rules(m: ModelConfig) -> MupRules | None:
    """The μP rules a model of this config is built with (None: the standard parametrization)."""
    return MODELS.get(m.arch).mup_rules(m) if m.parametrization == "mup" else None


def mup_hidden(model: torch.nn.Module, m: ModelConfig) -> HiddenMatrices | None:
    """μP's hidden matrices of a model built from `m`, for its optimizer (None: standard)."""
    rules = mup_rules(m)
    if rules is None:
        return None
    from app.components.models.mup.apply import hidden_rates

    return hidden_rates(model, m, rules)


def causal_lm(model: PreTrainedModel, m: ModelConfig) -> PreTrainedModel:
    """What every causal LM gets: μP's rules if asked, activation checkpointing if asked, no
    KV cache."""
    rules = mup_rules(m)
    if rules is not None:
        from app.components.models.mup.apply import apply_mup

        apply_mup(model, m, rules)
    if m.gradient_checkpointing:
        enable_activation_checkpointing(model)
    model.config.use_cache = False  # no KV cache while training: it only costs memory
    return model
