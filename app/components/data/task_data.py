"""What a task's data is once loaded: both splits and what building the model needs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass
class TaskData:
    """A task's data, built once per run: samples indexed by a LongTensor of sample indices."""

    train: Any  # train[indices] -> a step batch
    val: Any
    vocab_size: int
    tokenizer_name: str
    pad_id: int | None = None
    train_lengths: torch.Tensor | None = None  # per-sample lengths, for length-grouped sampling
    info: dict[str, Any] = field(default_factory=dict)  # saved in summary.json (label names...)
