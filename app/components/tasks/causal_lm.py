"""Causal language modelling: packed token blocks in, next-token cross-entropy out.

A block is `seq_len + 1` tokens (input = block[:-1], target = block[1:]); a negative token marks
padding, which is neither an input nor a target. The loss of an optimizer step is the mean over
the target tokens of the whole step.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from omegaconf import DictConfig

from app.components.tasks.base import Metric, TaskData

IGNORE = -100


class CausalLM:
    name = "causal_lm"
    unit = "target token"
    metrics = (Metric("loss", "minimize"),)

    def __init__(self, cfg: DictConfig | None = None) -> None:
        self.cfg = cfg  # the task node: nothing causal LM needs beyond the data and model
        # (data config as YAML, its tokenizer): a run asks at its start (saved in the run dir)
        # and at its end (the export); loading or training it again would be the same work.
        self._tokenizer: tuple[str, Any] | None = None

    def load_data(self, data_cfg: DictConfig) -> TaskData:
        from app.components.data.memo import data_key, remembered

        return remembered(data_key(self.name, data_cfg), lambda: self._load(data_cfg))

    def _load(self, data_cfg: DictConfig) -> TaskData:
        from app.components.data.tokens import load_token_data

        data = load_token_data(data_cfg)
        return TaskData(
            train=data.train,
            val=data.val,
            vocab_size=data.vocab_size,
            tokenizer_name=data.tokenizer_name,
            pad_id=data.pad_id,
        )

    def model_data(self, data_cfg: DictConfig, tokenizer: Any | None = None) -> TaskData:
        tok = self.export_tokenizer(data_cfg) if tokenizer is None else tokenizer
        # Synthetic ids without a tokenizer: the configured size is the vocabulary.
        vocab = data_cfg.tokenizer_vocab_size if tok is None else len(tok)
        empty = torch.empty(0, data_cfg.seq_len + 1, dtype=torch.int64)
        return TaskData(empty, empty, vocab, str(data_cfg.tokenizer), info={"tokenizer": tok})

    def export_tokenizer(self, data_cfg: DictConfig) -> Any | None:
        from omegaconf import OmegaConf

        from app.components.data.tokens import transformers_tokenizer

        key = OmegaConf.to_yaml(data_cfg)
        if self._tokenizer is None or self._tokenizer[0] != key:
            self._tokenizer = (key, transformers_tokenizer(data_cfg))
        return self._tokenizer[1]

    def sequence_length(self, data_cfg: DictConfig) -> int:
        return data_cfg.seq_len

    def build_model(self, model_cfg: DictConfig, data: TaskData) -> torch.nn.Module:
        from app.components.models.build import build_model

        return build_model(model_cfg, data.vocab_size)

    def inputs_and_targets(self, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = blocks[:, :-1], blocks[:, 1:]
        return x.clamp_min(0), y.where(y >= 0, IGNORE)

    def units(self, targets: torch.Tensor) -> int:
        return int((targets != IGNORE).sum())

    def tokens(self, inputs: torch.Tensor) -> int:
        return inputs.numel()

    def micro_batches(
        self, inputs: torch.Tensor, targets: torch.Tensor, sizes: Sequence[int]
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        offset = 0
        for n in sizes:
            yield inputs[offset : offset + n], targets[offset : offset + n]
            offset += n

    def loss_sum(
        self, model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        logits = model(input_ids=inputs).logits
        return F.cross_entropy(
            logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE, reduction="sum"
        )

    def eval_sums(
        self, model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        loss = self.loss_sum(model, inputs, targets).double()
        return torch.stack([loss, (targets != IGNORE).sum().double()])

    def eval_metrics(self, totals: Sequence[float]) -> dict[str, float]:
        loss = totals[0] / max(totals[1], 1.0)
        return {"loss": loss, "perplexity": math.exp(min(loss, 50.0))}

    def summary_fields(self) -> dict[str, Any]:
        return {}

    def worst_case(self, blocks: torch.Tensor, n: int) -> torch.Tensor:
        # Packed blocks are all full length: any n of them (repeated if there are fewer).
        return blocks[torch.arange(n) % len(blocks)]
