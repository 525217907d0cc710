"""The task seam: what differs between causal LM and sequence classification, and nothing else.

A task turns a step's samples into model inputs and targets, splits them into micro-batches,
computes the *summed* loss of a micro-batch and says how many units it is summed over (target
tokens for causal LM, samples for classification), so the loop can normalize by the units of
the whole optimizer step whatever the split. It also owns the evaluation sums and metrics, the
objective's direction for each metric, the data and the model head. The loop, the batch plan,
the probe, OOM recovery and the sweeper call these methods and never branch on a task's name.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from omegaconf import DictConfig


@dataclass(frozen=True)
class Metric:
    """An evaluation metric: logged as val/<name>, summarized as initial_val_<name> and
    final_val_<name>, and reported to an HPO trial as val_<name>."""

    name: str
    direction: str  # minimize | maximize: what an HPO study on it should do


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


class Task(Protocol):
    name: str
    unit: str  # what the loss is averaged over: "target token" | "sample"
    metrics: tuple[Metric, ...]  # the first is the loss

    def load_data(self, data_cfg: DictConfig) -> TaskData: ...

    def model_data(self, data_cfg: DictConfig, tokenizer: Any | None = None) -> TaskData:
        """What building the model needs (vocabulary, labels, padding id), without tokenizing
        the samples where the task can: `python -m app.export` rebuilds a checkpoint's model from it.
        `tokenizer`: the run's own, saved in its run dir; given, it is used (and needs no data
        where the task needs the data only for its tokenizer)."""
        ...

    def export_tokenizer(self, data_cfg: DictConfig) -> Any | None:
        """This data's transformers tokenizer, saved beside the model by the export."""
        ...

    def sequence_length(self, data_cfg: DictConfig) -> int:
        """The longest sequence the model sees: memory and FLOPs per sample follow from it."""
        ...

    def build_model(self, model_cfg: DictConfig, data: TaskData) -> torch.nn.Module: ...

    def inputs_and_targets(self, batch: Any) -> tuple[Any, torch.Tensor]:
        """A host step batch -> (inputs, targets); len(inputs) is the number of samples."""
        ...

    def units(self, targets: torch.Tensor) -> int:
        """How many units the loss of these targets is summed over (host: no device sync)."""
        ...

    def tokens(self, inputs: Any) -> int:
        """Input tokens that carry data (not padding): what tokens/s counts."""
        ...

    def micro_batches(
        self, inputs: Any, targets: torch.Tensor, sizes: Sequence[int]
    ) -> Iterator[tuple[Any, torch.Tensor]]:
        """Split a step into micro-batches of `sizes` samples (their sum is len(inputs))."""
        ...

    def loss_sum(self, model: torch.nn.Module, inputs: Any, targets: torch.Tensor) -> torch.Tensor:
        """The loss summed over the micro-batch's units (the caller divides by the step's)."""
        ...

    def eval_sums(self, model: torch.nn.Module, inputs: Any, targets: torch.Tensor) -> torch.Tensor:
        """float64 sums of one evaluation micro-batch; added over batches and ranks."""
        ...

    def eval_metrics(self, totals: Sequence[float]) -> dict[str, float]:
        """Metrics from the summed eval_sums: at least every name in `metrics`."""
        ...

    def worst_case(self, samples: Any, n: int) -> Any:
        """n samples as large as any the run will see: what the micro-batch probe trains on."""
        ...

    def summary_fields(self) -> dict[str, Any]:
        """What summary.json records about the task once its data is loaded (label names...)."""
        ...


def move(inputs: Any, device: torch.device) -> Any:
    """Inputs to the device: a tensor or a task's batch type, both with `.to()`."""
    return inputs.to(device, non_blocking=True)
