"""Value checks every config goes through before any work: ranges and unknown keys.

Each numeric setting has one declared range here, so a NaN, an infinity or an absurd value is
refused with the same kind of line wherever it comes from (command line, experiment file, sweep).
Unknown keys are refused however they got in: Hydra's `+key=value` appends to a typed node
without asking the schema.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

INF = math.inf


class ConfigError(ValueError):
    """A setting the user can fix; the message is one line naming the key and what is allowed."""


def first_line(exc: BaseException) -> str:
    """A library's error in one line (its first non-blank one), for a ConfigError's message."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__


@dataclass(frozen=True)
class Bound:
    """A numeric setting's allowed range; `integer` also refuses floats and booleans."""

    key: str
    low: float = -INF
    high: float = INF
    low_open: bool = False  # (low, ... rather than [low, ...
    high_open: bool = False
    integer: bool = False
    nullable: bool = False

    def allowed(self) -> str:
        kind = "an integer" if self.integer else "a finite number"
        if self.low == -INF and self.high == INF:
            return kind
        if self.high == INF:
            return f"{kind} {'>' if self.low_open else '>='} {_num(self.low)}"
        left = "(" if self.low_open else "["
        right = ")" if self.high_open else "]"
        return f"{kind} in {left}{_num(self.low)}, {_num(self.high)}{right}"

    def check(self, value: Any) -> None:
        if value is None and self.nullable:
            return
        if not self._ok(value):
            null = " or null" if self.nullable else ""
            raise ConfigError(f"{self.key}={_show(value)} must be {self.allowed()}{null}")

    def _ok(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if self.integer and not isinstance(value, int):
            return False
        if not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def positive_int(key: str, nullable: bool = False) -> Bound:
    return Bound(key, low=1, integer=True, nullable=nullable)


def count(key: str) -> Bound:
    return Bound(key, low=0, integer=True)


def fraction(key: str, low_open: bool = False, high_open: bool = False) -> Bound:
    return Bound(key, 0.0, 1.0, low_open=low_open, high_open=high_open)


# The numeric settings of the schema (app/config.py). Integer counts are >= 1 unless a 0 means
# "off"; every float is finite. The learning rate is for AdamW, whose step is about lr per
# parameter whatever the gradient's scale: above 1 every weight moves by more than its size.
BOUNDS: tuple[Bound, ...] = (
    Bound("gpu.memory_gib", low=0, low_open=True, nullable=True),
    Bound("gpu.compute_capability", low=0, nullable=True),
    count("gpu.dataloader_workers"),
    Bound("gpu.memory_headroom", 0.0, 0.9),
    positive_int("model.vocab_size", nullable=True),
    positive_int("model.n_layer"),
    positive_int("model.n_head"),
    positive_int("model.n_kv_head", nullable=True),
    positive_int("model.n_embd"),
    positive_int("model.intermediate_size", nullable=True),
    positive_int("model.max_position_embeddings"),
    fraction("model.dropout", high_open=True),
    Bound("data.tokenizer_vocab_size", low=257, integer=True),
    positive_int("data.seq_len"),
    Bound("data.val_fraction", 0.0, 0.5, low_open=True, high_open=True),
    Bound("data.builtin_num_docs", low=2, integer=True),
    Bound("data.synthetic_num_tokens", low=2, integer=True),
    positive_int("data.prefetch_factor"),
    Bound("data.max_length", low=2, integer=True),  # at least [CLS] and [SEP]
    positive_int("data.group_steps"),
    Bound("task.label_smoothing", 0.0, 1.0, high_open=True),
    count("data.seed"),
    positive_int("training.effective_batch_size"),
    positive_int("training.max_steps"),
    Bound("training.lr", 0.0, 1.0, low_open=True),
    fraction("training.min_lr_ratio"),
    count("training.warmup_steps"),
    Bound("training.weight_decay", low=0.0),
    Bound("training.eps", 0.0, 1.0, low_open=True, high_open=True),
    Bound("training.max_grad_norm", low=0.0),
    positive_int("training.eval_every"),
    positive_int("training.eval_samples"),
    positive_int("training.log_every"),
    count("training.checkpoint_every"),
    positive_int("training.keep_checkpoints"),
    count("training.seed"),
    count("training.profiler.steps"),
    count("training.profiler.start_step"),
    positive_int("training.auto_batch.max_micro_batch"),
    positive_int("training.auto_batch.max_probe_steps"),
    Bound("training.auto_batch.max_probe_seconds", low=0.0, low_open=True),
    positive_int("training.auto_batch.cpu_max_micro_batch"),
    fraction("training.auto_batch.cpu_memory_fraction", low_open=True),
    Bound("faults.oom_above_micro_batch", low=0, integer=True, nullable=True),
    count("faults.oom_from_step"),
    Bound("faults.oom_rank", low=0, integer=True, nullable=True),
)


def check_bounds(cfg: DictConfig, bounds: tuple[Bound, ...] = BOUNDS) -> None:
    for bound in bounds:
        value = OmegaConf.select(cfg, bound.key, default=_ABSENT)
        if value is not _ABSENT:
            bound.check(value)


_ABSENT = object()


def check_known_keys(cfg: DictConfig, path: str = "") -> None:
    """Every key of a node typed by a schema dataclass must be one of its fields."""
    schema = OmegaConf.get_type(cfg)
    fields = (
        {f.name for f in dataclasses.fields(schema)} if dataclasses.is_dataclass(schema) else None
    )
    # resolve=False: values may be interpolations that only resolve at run time.
    for key, child in cfg.items_ex(resolve=False):
        full = f"{path}{key}"
        if fields is not None and key not in fields:
            parent = path.rstrip(".")
            where = f" in {parent}" if parent else ""
            known = ", ".join(sorted(fields))
            raise ConfigError(f"{full}: no such setting{where}; known keys: {known}")
        if isinstance(child, DictConfig) and cfg.get(key) is not None:  # a typed null: hpo
            check_known_keys(child, f"{full}.")
