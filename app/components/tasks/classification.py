"""Sequence classification of single texts or text pairs (NLI: premise/hypothesis -> label).

Samples are padded rows (app/components/data/labelled/padded.py). A step's samples are split into
micro-batches by length (longest first), each padded only to its own longest row rounded up to
a multiple of 8. The loss of an optimizer step is the mean cross-entropy over the step's
*samples* whatever the split, with optional label smoothing in training; evaluation reports the
plain cross-entropy, accuracy and macro-F1.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from app.components.data.kinds import LABELLED_TEXT
from app.components.data.labelled.columns import wanted_columns
from app.components.data.labelled.nli_corpus import COLUMNS as NLI_COLUMNS
from app.components.models.heads import SEQUENCE_CLASSIFIER
from app.components.tasks import TASKS
from app.components.tasks.base import Metric, Task, TaskData
from app.core.json_types import Json

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from app.components.data.config import DataConfig
    from app.components.data.labelled.padded import PaddedRows, PairInputs
    from app.components.models.config import ModelConfig
    from app.components.tasks.config import TaskConfig


@TASKS.add
class SequenceClassification(Task["PaddedRows", "PairInputs"]):
    name = "classification"
    unit = "sample"
    metrics = (Metric("loss", "minimize"), Metric("accuracy", "maximize"), Metric("f1", "maximize"))
    head = SEQUENCE_CLASSIFIER
    reads = LABELLED_TEXT
    sequence_setting = "max_length"
    byte_vocab = 259  # 256 bytes + [PAD], [CLS] and [SEP] (app/components/data/labelled/texts.py)
    builtin_corpus = "NLI corpus"
    builtin_columns = NLI_COLUMNS  # app/components/data/labelled/nli_corpus.py

    def __init__(self, cfg: TaskConfig | None = None) -> None:
        super().__init__(cfg)
        self.label_smoothing = float(cfg.label_smoothing) if cfg is not None else 0.0
        self.given_labels = list(cfg.labels) if cfg is not None and cfg.labels else None
        self.label_names: list[str] = []  # known once the data is loaded
        self.tokenizer: PreTrainedTokenizerBase | None = None  # likewise

    # -- facts ----------------------------------------------------------------------------------

    def row_columns(self, data: DataConfig) -> list[tuple[str, str]]:
        return wanted_columns(data)

    def step_line(self, effective_batch: int, seq_len: int) -> str:
        return (
            f"samples    {effective_batch:,} per optimizer step, loss averaged over them "
            f"(max_length {seq_len}, padded per micro-batch)"
        )

    # -- data and model ---------------------------------------------------------------------

    def load_data(self, data_cfg: DataConfig) -> TaskData[PaddedRows]:
        from app.components.data.memo import data_key, remembered

        key = data_key(self.name, data_cfg, self.given_labels)
        data = remembered(key, lambda: self._load(data_cfg))
        self.label_names, self.tokenizer = list(data.info["labels"]), data.info["tokenizer"]
        return data

    def _load(self, data_cfg: DataConfig) -> TaskData[PaddedRows]:
        from app.components.data.labelled.texts import load_labelled

        data = load_labelled(data_cfg, self.given_labels)
        return TaskData(
            train=data.train,
            val=data.val,
            vocab_size=data.vocab_size,
            tokenizer_name=data.tokenizer_name,
            pad_id=data.pad_id,
            train_lengths=data.train.lengths,
            info={"labels": data.label_names, "tokenizer": data.tokenizer},
        )

    def model_data(
        self, data_cfg: DataConfig, tokenizer: PreTrainedTokenizerBase | None = None
    ) -> TaskData[PaddedRows]:
        data = self.load_data(data_cfg)  # the labels come from the data (cached by content)
        if tokenizer is None:
            return data
        self.tokenizer = tokenizer
        return replace(
            data,
            vocab_size=len(tokenizer),
            pad_id=tokenizer.pad_token_id,
            info={**data.info, "tokenizer": tokenizer},
        )

    def export_tokenizer(self, data_cfg: DataConfig) -> PreTrainedTokenizerBase | None:
        if self.tokenizer is None:
            self.load_data(data_cfg)
        return self.tokenizer

    def load_pretrained(self, model: ModelConfig, data: TaskData[PaddedRows]) -> torch.nn.Module:
        from app.components.models.classifiers import load_pretrained_classifier

        return load_pretrained_classifier(model, data)

    # -- steps ------------------------------------------------------------------------------

    def inputs_and_targets(self, rows: PaddedRows) -> tuple[PairInputs, torch.Tensor]:
        return rows.inputs(), rows.labels

    def units(self, targets: torch.Tensor) -> int:
        return len(targets)

    def tokens(self, inputs: PairInputs) -> int:
        return int(inputs.lengths.sum())

    def micro_batches(
        self, inputs: PairInputs, targets: torch.Tensor, sizes: Sequence[int]
    ) -> Iterator[tuple[PairInputs, torch.Tensor]]:
        import torch

        from app.components.data.labelled.padded import PairInputs

        # Longest first, so each micro-batch holds rows of similar length; stable, so the split
        # is a pure function of the step's samples.
        order = torch.sort(inputs.lengths, descending=True, stable=True).indices
        offset = 0
        for n in sizes:
            pick = order[offset : offset + n]
            offset += n
            types = None if inputs.token_type_ids is None else inputs.token_type_ids[pick]
            part = PairInputs(inputs.input_ids[pick], types, inputs.lengths[pick])
            yield part.trimmed(), targets[pick]

    def logits(self, model: torch.nn.Module, inputs: PairInputs) -> torch.Tensor:
        return model(**inputs.model_kwargs()).logits.float()

    def loss_sum(
        self, model: torch.nn.Module, inputs: PairInputs, targets: torch.Tensor
    ) -> torch.Tensor:
        import torch.nn.functional as F

        # Training only: evaluation (eval_sums) reports the plain cross-entropy.
        return F.cross_entropy(
            self.logits(model, inputs),
            targets,
            reduction="sum",
            label_smoothing=self.label_smoothing,
        )

    # -- evaluation -------------------------------------------------------------------------

    def eval_sums(
        self, model: torch.nn.Module, inputs: PairInputs, targets: torch.Tensor
    ) -> torch.Tensor:
        """[loss sum, samples, correct, true positives (C), predicted (C), actual (C)]."""
        import torch
        import torch.nn.functional as F

        logits = self.logits(model, inputs)
        loss = F.cross_entropy(logits, targets, reduction="sum").double()
        predicted = logits.argmax(dim=-1)
        classes = logits.shape[-1]
        hits = predicted == targets
        tp = torch.bincount(targets[hits], minlength=classes)
        pred = torch.bincount(predicted, minlength=classes)
        true = torch.bincount(targets, minlength=classes)
        counts = torch.stack([targets.new_tensor(len(targets)), hits.sum()]).double()
        return torch.cat([loss[None], counts, tp.double(), pred.double(), true.double()])

    def eval_metrics(self, totals: Sequence[float]) -> dict[str, float]:
        loss, n, correct = totals[0], max(totals[1], 1.0), totals[2]
        classes = (len(totals) - 3) // 3
        tp, pred, true = (totals[3 + k * classes : 3 + (k + 1) * classes] for k in range(3))
        f1s = [2 * t / (p + a) if p + a else 0.0 for t, p, a in zip(tp, pred, true, strict=True)]
        return {"loss": loss / n, "accuracy": correct / n, "f1": sum(f1s) / max(len(f1s), 1)}

    def summary_fields(self) -> dict[str, Json]:
        labels: list[Json] = list(self.label_names)
        return {"labels": labels, "label_smoothing": self.label_smoothing}

    def worst_case(self, rows: PaddedRows, n: int) -> PaddedRows:
        import torch

        from app.components.data.labelled.padded import PaddedRows

        # Memory grows with the padded width: n rows as long as max_length allows.
        picked = rows[torch.arange(n) % len(rows)]
        full = torch.full_like(picked.lengths, rows.max_length)
        return PaddedRows(picked.input_ids, picked.token_type_ids, full, picked.labels)
