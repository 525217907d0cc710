"""Causal language modelling: packed token blocks in, next-token cross-entropy out.

A block is `seq_len + 1` tokens (input = block[:-1], target = block[1:]); a negative token marks
padding, which is neither an input nor a target. The loss of an optimizer step is the mean over
the target tokens of the whole step.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from app.components.data.kinds import TEXT
from app.components.models.families import MODELS
from app.components.models.heads import CAUSAL_LM
from app.components.tasks import TASKS
from app.components.tasks.base import Metric, Task, TaskData
from app.core.errors import ConfigError

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from app.components.data.config import DataConfig
    from app.components.models.config import ModelConfig
    from app.components.tasks.config import TaskConfig

IGNORE = -100


@TASKS.add
class CausalLM(Task["torch.Tensor", "torch.Tensor"]):
    name = "causal_lm"
    unit = "target token"
    packed = True
    metrics = (Metric("loss", "minimize"),)
    head = CAUSAL_LM
    reads = TEXT
    sequence_setting = "seq_len"
    byte_vocab = 256
    builtin_corpus = "corpus"

    def __init__(self, cfg: TaskConfig | None = None) -> None:
        super().__init__(cfg)  # nothing causal LM needs beyond the data and model
        # (data config, its tokenizer): a run asks at its start (saved in the run dir) and at
        # its end (the export); loading or training it again would be the same work.
        self._tokenizer: tuple[str, PreTrainedTokenizerBase | None] | None = None

    # -- facts ----------------------------------------------------------------------------------

    def row_columns(self, data: DataConfig) -> list[tuple[str, str]]:
        return [("data.text_column", data.text_column)]

    def check_vocab(self, model: ModelConfig, data: DataConfig) -> None:
        # A checkpoint's vocabulary is its own (checked against its files before any work).
        if data.tokenizer == "byte" and not MODELS.get(model.arch).loads_checkpoint:
            vocab = model.vocab_size
            if vocab is not None and vocab < self.byte_vocab:
                raise ConfigError(
                    f"model.vocab_size={vocab} is smaller than the byte tokenizer's 256 symbols; "
                    "use model.vocab_size>=256 or null"
                )

    def step_line(self, effective_batch: int, seq_len: int) -> str:
        return f"tokens     {effective_batch * seq_len:,} per optimizer step (seq_len {seq_len})"

    # -- data and model -------------------------------------------------------------------------

    def load_data(self, data: DataConfig) -> TaskData[torch.Tensor]:
        from app.components.data.memo import data_key, remembered

        return remembered(data_key(self.name, data), lambda: self._load(data))

    def _load(self, data: DataConfig) -> TaskData[torch.Tensor]:
        from app.components.data.lm.tokens import load_token_data

        tokens = load_token_data(data)
        return TaskData(
            train=tokens.train,
            val=tokens.val,
            vocab_size=tokens.vocab_size,
            tokenizer_name=tokens.tokenizer_name,
            pad_id=tokens.pad_id,
        )

    def model_data(
        self, data: DataConfig, tokenizer: PreTrainedTokenizerBase | None = None
    ) -> TaskData[torch.Tensor]:
        import torch

        tok = self.export_tokenizer(data) if tokenizer is None else tokenizer
        # Synthetic ids without a tokenizer: the configured size is the vocabulary.
        vocab = data.tokenizer_vocab_size if tok is None else len(tok)
        empty = torch.empty(0, data.seq_len + 1, dtype=torch.int64)
        return TaskData(empty, empty, vocab, str(data.tokenizer), info={"tokenizer": tok})

    def export_tokenizer(self, data: DataConfig) -> PreTrainedTokenizerBase | None:
        from app.components.data.lm.tokens import transformers_tokenizer

        key = json.dumps(dataclasses.asdict(data), sort_keys=True, default=str)
        if self._tokenizer is None or self._tokenizer[0] != key:
            self._tokenizer = (key, transformers_tokenizer(data))
        return self._tokenizer[1]

    def load_pretrained(self, model: ModelConfig, data: TaskData[torch.Tensor]) -> torch.nn.Module:
        from app.components.models.causal_lm import load_pretrained_lm

        return load_pretrained_lm(model, data.vocab_size)

    # -- steps ----------------------------------------------------------------------------------

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
        import torch.nn.functional as F

        logits = model(input_ids=inputs).logits
        return F.cross_entropy(
            logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE, reduction="sum"
        )

    def eval_sums(
        self, model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        import torch

        loss = self.loss_sum(model, inputs, targets).double()
        return torch.stack([loss, (targets != IGNORE).sum().double()])

    def eval_metrics(self, totals: Sequence[float]) -> dict[str, float]:
        loss = totals[0] / max(totals[1], 1.0)
        return {"loss": loss, "perplexity": math.exp(min(loss, 50.0))}

    def worst_case(self, blocks: torch.Tensor, n: int) -> torch.Tensor:
        import torch

        # Packed blocks are all full length: any n of them (repeated if there are fewer).
        return blocks[torch.arange(n) % len(blocks)]
