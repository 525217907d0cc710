"""What a task's data is once loaded: both splits and what building the model needs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypedDict, TypeVar

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

S = TypeVar("S")  # a split: samples[indices] -> a step batch (packed blocks, padded rows)


class DataInfo(TypedDict, total=False):
    """What the model and the export need besides the samples."""

    labels: list[str]  # classification: the label names in id order
    tokenizer: PreTrainedTokenizerBase | None  # saved beside the model (None: synthetic ids)


@dataclass
class TaskData(Generic[S]):
    """A task's data, built once per run: samples indexed by a LongTensor of sample indices."""

    train: S
    val: S
    vocab_size: int
    tokenizer_name: str
    pad_id: int | None = None
    train_lengths: torch.Tensor | None = None  # per-sample lengths, for length-grouped sampling
    info: DataInfo = field(default_factory=lambda: DataInfo())
