"""The task seam: what differs between causal LM and sequence classification, and nothing else.

A task turns a step's samples into model inputs and targets, splits them into micro-batches,
computes the *summed* loss of a micro-batch and says how many units it is summed over (target
tokens for causal LM, samples for classification), so the loop can normalize by the units of
the whole optimizer step whatever the split. It also owns the evaluation sums and metrics, the
objective's direction for each metric, the data and the model head, and the facts the checks
and the banner need (which data setting bounds a sample, which columns rows must have). The
loop, the batch plan, the probe, OOM recovery and the sweeper call these methods and never
branch on a task's name.

Task modules are read while a config is validated (`--cfg job` too), so torch is imported in the
methods that compute, not at the top.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Generic, Protocol, TypeVar

from app.components.data.kinds import SampleKind
from app.components.data.task_data import TaskData
from app.components.models.heads import Head
from app.core.json_types import Json

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase
    from typing_extensions import Self

    from app.components.data.config import DataConfig
    from app.components.models.config import ModelConfig
    from app.components.tasks.config import TaskConfig


@dataclass(frozen=True)
class Metric:
    """An evaluation metric: logged as val/<name>, summarized as initial_val_<name> and
    final_val_<name>, and reported to an HPO trial as val_<name> (app/hpo.py names them)."""

    name: str
    direction: str  # minimize | maximize: what an HPO study on it should do

    @property
    def logged(self) -> str:
        """Its TensorBoard tag (and metrics.jsonl key)."""
        return f"val/{self.name}"

    @property
    def reported(self) -> str:
        """What an HPO trial is told at each evaluation (hpo.report_metric)."""
        return f"val_{self.name}"

    @property
    def initial(self) -> str:
        """Its summary.json key at step 0 (training.eval_at_start)."""
        return f"initial_val_{self.name}"

    @property
    def final(self) -> str:
        """Its summary.json key at the last evaluation (an hpo.metric)."""
        return f"final_val_{self.name}"


class Movable(Protocol):
    """Model inputs a step moves to the device: a tensor, or a task's own batch type."""

    def to(self, device: torch.device, *, non_blocking: bool = ...) -> Self: ...


Batch = TypeVar("Batch")  # a host step batch: samples[indices] (packed blocks, padded rows)
Inputs = TypeVar("Inputs", bound=Movable)  # what the model is called with
M = TypeVar("M", bound=Movable)


class Task(abc.ABC, Generic[Batch, Inputs]):
    """One task, over its own batch and input types (the loop is generic over both)."""

    name: ClassVar[str]  # task.name=NAME
    unit: ClassVar[str]  # what the loss is averaged over: "target token" | "sample"
    metrics: ClassVar[tuple[Metric, ...]]  # the first is the loss
    head: ClassVar[Head]  # what it trains: a model family must build (or load) this head
    reads: ClassVar[SampleKind]  # what it learns from: a data source must give these samples
    sequence_setting: ClassVar[str]  # the data setting that bounds a sample's length
    byte_vocab: ClassVar[int]  # ids the byte tokenizer makes for it (special tokens added)
    builtin_corpus: ClassVar[str]  # what data.source=builtin gives it
    builtin_columns: ClassVar[tuple[str, ...] | None] = None  # that corpus's columns, if rows
    # Every sample is a block of sequence_length tokens (a budget in tokens is exact); padded
    # samples vary in length.
    packed: ClassVar[bool] = False

    def __init__(self, cfg: TaskConfig | None = None) -> None:
        self.cfg = cfg

    # -- facts of a config, read before any work ----------------------------------------------

    def sequence_length(self, data: DataConfig) -> int:
        """The longest sequence the model sees: memory and FLOPs per sample follow from it."""
        return int(getattr(data, self.sequence_setting))

    @abc.abstractmethod
    def row_columns(self, data: DataConfig) -> list[tuple[str, str]]:
        """(setting, column) pairs every row of a labelled or text data set must have."""

    def check_vocab(self, model: ModelConfig, data: DataConfig) -> None:
        """What a model's vocabulary must cover, known from the config alone."""
        return None

    @abc.abstractmethod
    def step_line(self, effective_batch: int, seq_len: int) -> str:
        """The banner's line about one optimizer step's samples."""

    # -- data and model -------------------------------------------------------------------------

    @abc.abstractmethod
    def load_data(self, data: DataConfig) -> TaskData[Batch]: ...

    @abc.abstractmethod
    def model_data(
        self, data: DataConfig, tokenizer: PreTrainedTokenizerBase | None = None
    ) -> TaskData[Batch]:
        """What building the model needs (vocabulary, labels, padding id), without tokenizing
        the samples where the task can: `python -m app.export` rebuilds a checkpoint's model
        from it. `tokenizer`: the run's own, saved in its run dir; given, it is used (and needs
        no data where the task needs the data only for its tokenizer)."""

    @abc.abstractmethod
    def export_tokenizer(self, data: DataConfig) -> PreTrainedTokenizerBase | None:
        """This data's transformers tokenizer, saved beside the model by the export."""

    def build_model(self, model: ModelConfig, data: TaskData[Batch]) -> torch.nn.Module:
        from app.components.models.families import MODELS

        return MODELS.get(model.arch).build(model, data, self)

    @abc.abstractmethod
    def load_pretrained(self, model: ModelConfig, data: TaskData[Batch]) -> torch.nn.Module:
        """A checkpoint (model.path) with this task's head."""

    def summary_fields(self) -> dict[str, Json]:
        """What summary.json records about the task once its data is loaded (label names...)."""
        return {}

    # -- steps ----------------------------------------------------------------------------------

    @abc.abstractmethod
    def inputs_and_targets(self, batch: Batch) -> tuple[Inputs, torch.Tensor]:
        """A host step batch -> (inputs, targets); len(inputs) is the number of samples."""

    @abc.abstractmethod
    def units(self, targets: torch.Tensor) -> int:
        """How many units the loss of these targets is summed over (host: no device sync)."""

    @abc.abstractmethod
    def tokens(self, inputs: Inputs) -> int:
        """Input tokens that carry data (not padding): what tokens/s counts."""

    @abc.abstractmethod
    def micro_batches(
        self, inputs: Inputs, targets: torch.Tensor, sizes: Sequence[int]
    ) -> Iterator[tuple[Inputs, torch.Tensor]]:
        """Split a step into micro-batches of `sizes` samples (their sum is len(inputs))."""

    @abc.abstractmethod
    def loss_sum(
        self, model: torch.nn.Module, inputs: Inputs, targets: torch.Tensor
    ) -> torch.Tensor:
        """The loss summed over the micro-batch's units (the caller divides by the step's)."""

    @abc.abstractmethod
    def eval_sums(
        self, model: torch.nn.Module, inputs: Inputs, targets: torch.Tensor
    ) -> torch.Tensor:
        """float64 sums of one evaluation micro-batch; added over batches and ranks."""

    @abc.abstractmethod
    def eval_metrics(self, totals: Sequence[float]) -> dict[str, float]:
        """Metrics from the summed eval_sums: at least every name in `metrics`."""

    @abc.abstractmethod
    def worst_case(self, samples: Batch, n: int) -> Batch:
        """n samples as large as any the run will see: what the micro-batch probe trains on."""


def move(inputs: M, device: torch.device) -> M:
    """Inputs to the device: a tensor or a task's batch type, both with `.to()`."""
    return inputs.to(device, non_blocking=True)
