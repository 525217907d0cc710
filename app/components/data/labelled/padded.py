"""Tokenized samples of different lengths: stored padded to the longest, trimmed per micro-batch.

Rows are kept as one int32 tensor padded to `max_length` plus each row's length, so a step's
samples are one fancy-index away. A micro-batch is padded only to its own longest row, rounded
up to a multiple of 8: few distinct shapes (cudnn.benchmark, torch.compile) and tensor-core
friendly ones, with little padding once rows of similar length travel together.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PAD_MULTIPLE = 8


def padded_length(longest: int, limit: int) -> int:
    """`longest` rounded up to a multiple of 8, never beyond `limit` (the stored width)."""
    return min(limit, -(-longest // PAD_MULTIPLE) * PAD_MULTIPLE)


@dataclass
class PairInputs:
    """Model inputs of some samples: ids and segment ids padded to a common width."""

    input_ids: torch.Tensor  # int [n, width]
    token_type_ids: torch.Tensor | None  # int [n, width]; None for single texts
    lengths: torch.Tensor  # int [n]: row i is input_ids[i, :lengths[i]]

    def __len__(self) -> int:
        return len(self.lengths)

    def to(self, device: torch.device, non_blocking: bool = False) -> PairInputs:
        def move(t: torch.Tensor) -> torch.Tensor:
            return t.to(device, torch.long, non_blocking=non_blocking)

        types = None if self.token_type_ids is None else move(self.token_type_ids)
        return PairInputs(move(self.input_ids), types, move(self.lengths))

    def attention_mask(self) -> torch.Tensor:
        width = self.input_ids.shape[1]
        return torch.arange(width, device=self.lengths.device) < self.lengths[:, None]

    def model_kwargs(self) -> dict[str, torch.Tensor]:
        kwargs = {"input_ids": self.input_ids, "attention_mask": self.attention_mask().long()}
        if self.token_type_ids is not None:
            kwargs["token_type_ids"] = self.token_type_ids
        return kwargs

    def trimmed(self) -> PairInputs:
        """The same rows, padded only to their longest (rounded up to a multiple of 8)."""
        width = padded_length(int(self.lengths.max()), self.input_ids.shape[1])
        types = None if self.token_type_ids is None else self.token_type_ids[:, :width]
        return PairInputs(self.input_ids[:, :width], types, self.lengths)


@dataclass
class PaddedRows:
    """A labelled split: every row padded to max_length; indexing returns another PaddedRows."""

    input_ids: torch.Tensor  # int32 [N, max_length]
    token_type_ids: torch.Tensor | None  # int8 [N, max_length]
    lengths: torch.Tensor  # int32 [N]
    labels: torch.Tensor  # int64 [N]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: torch.Tensor | slice) -> PaddedRows:
        types = None if self.token_type_ids is None else self.token_type_ids[index]
        return PaddedRows(self.input_ids[index], types, self.lengths[index], self.labels[index])

    def inputs(self) -> PairInputs:
        return PairInputs(self.input_ids, self.token_type_ids, self.lengths)

    def pin_memory(self) -> PaddedRows:
        """The DataLoader pins a batch through this method (pin_memory=True on CUDA)."""
        types = None if self.token_type_ids is None else self.token_type_ids.pin_memory()
        return PaddedRows(
            self.input_ids.pin_memory(),
            types,
            self.lengths.pin_memory(),
            self.labels.pin_memory(),
        )

    @property
    def max_length(self) -> int:
        return self.input_ids.shape[1]


def pad_rows(
    ids: list[list[int]],
    type_ids: list[list[int]] | None,
    labels: list[int],
    max_length: int,
    pad_id: int,
) -> PaddedRows:
    """Ragged token lists (already truncated to max_length) -> PaddedRows."""
    n = len(ids)
    lengths = torch.tensor([len(row) for row in ids], dtype=torch.int32)
    input_ids = torch.full((n, max_length), pad_id, dtype=torch.int32)
    types = None if type_ids is None else torch.zeros((n, max_length), dtype=torch.int8)
    for i, row in enumerate(ids):
        input_ids[i, : len(row)] = torch.tensor(row, dtype=torch.int32)
        if types is not None and type_ids is not None:
            types[i, : len(row)] = torch.tensor(type_ids[i], dtype=torch.int8)
    return PaddedRows(input_ids, types, lengths, torch.tensor(labels, dtype=torch.int64))
