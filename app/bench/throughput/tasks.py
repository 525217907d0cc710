"""What the benchmark does per task (app/components/tasks/): the unit of throughput, how the
bare loop samples and splits a step, and how a transformers Trainer user feeds the same data.

`bench_task(cfg)` looks the strategy up once by the task: each strategy names the task class it
measures and registers itself (`@benchmarks`), and a task that extends another (a CausalLM
with its own head) is measured by the strategy of the nearest one it extends that has one, so
a new task is benchmarked with no strategy of its own unless its samples or steps differ. The
workers call its methods and never branch on the task. Data and model come from the project's
own Task (`task.load_data`, `task.build_model`), so the three contenders train the same model
on the same samples.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar

import torch
import torch.nn.functional as F

from app.components.tasks import build_task
from app.components.tasks.base import Task, TaskData
from app.components.tasks.causal_lm import CausalLM
from app.components.tasks.classification import SequenceClassification
from app.config.schema import TrainConfig
from app.core.errors import ConfigError


class TaskBench(abc.ABC):
    """The benchmark's strategy for one task."""

    measures: ClassVar[type[Task]]  # the task it measures
    unit: ClassVar[str]  # what throughput counts: "tokens" | "samples"

    def __init__(self, task: Task, cfg: TrainConfig) -> None:
        self.task, self.cfg = task, cfg

    @abc.abstractmethod
    def step_work(self, batch, sizes: Sequence[int]) -> tuple[int, int]:
        """(tokens that carry data, tokens computed with padding) of a host step batch."""

    @abc.abstractmethod
    def bare_sampler(self, data: TaskData) -> Callable[[int], torch.Tensor]:
        """step -> the step's sample indices."""

    @abc.abstractmethod
    def bare_backward(self, model, batch, micro: int, accum: int, amp, dev) -> torch.Tensor:
        """Forward and backward of every micro-batch of a step; the last one's loss."""

    @abc.abstractmethod
    def hf_setup(self, data: TaskData) -> tuple[Any, dict[str, Any], dict[str, Any]]:
        """(train dataset, extra TrainingArguments, extra Trainer arguments)."""

    @abc.abstractmethod
    def hf_micro_loss(self, last: float, accum: int) -> float:
        """A micro-batch's loss as the Trainer logs it, as a share of the step's."""


BENCH_TASKS: dict[str, type[TaskBench]] = {}  # task.name -> its strategy, filled by @benchmarks
B = TypeVar("B", bound=type[TaskBench])


def benchmarks(cls: B) -> B:
    """Register a strategy for the task it `measures`."""
    BENCH_TASKS[cls.measures.name] = cls
    return cls


def strategy_of(task: type[Task]) -> type[TaskBench] | None:
    """The strategy registered for `task`, or for the nearest task class it extends."""
    for cls in task.__mro__:
        name = cls.__dict__.get("name")
        if isinstance(name, str) and name in BENCH_TASKS:
            return BENCH_TASKS[name]
    return None


def bench_task(cfg: TrainConfig) -> TaskBench:
    task = build_task(cfg.task)
    strategy = strategy_of(type(task))
    if strategy is None:
        raise ConfigError(
            f"task={task.name} has no benchmark strategy; benchmarked: {', '.join(BENCH_TASKS)}"
        )
    return strategy(task, cfg)


@benchmarks
class CausalLMBench(TaskBench):
    """Packed token blocks: every step is `effective_batch * seq_len` tokens, no padding."""

    measures = CausalLM
    unit = "tokens"

    def step_work(self, blocks: torch.Tensor, sizes: Sequence[int]) -> tuple[int, int]:
        """(tokens that carry data, tokens computed with padding) of a host step batch."""
        n = blocks.shape[0] * (blocks.shape[1] - 1)
        return n, n

    # -- the bare loop ----------------------------------------------------------------------

    def bare_sampler(self, data: TaskData) -> Callable[[int], torch.Tensor]:
        """step -> the step's sample indices: uniform with replacement."""
        gen = torch.Generator().manual_seed(self.cfg.data.seed)
        n = self.cfg.training.effective_batch_size
        return lambda step: torch.randint(len(data.train), (n,), generator=gen)

    def bare_backward(
        self, model, blocks: torch.Tensor, micro: int, accum: int, amp, dev
    ) -> torch.Tensor:
        """Forward and backward of every micro-batch; the last one's loss, as a share of the
        step's (times `accum`: the micro-batch mean)."""
        batch = blocks.to(dev, non_blocking=True)
        for i in range(accum):
            part = batch[i * micro : (i + 1) * micro]
            with amp:
                logits = model(input_ids=part[:, :-1]).logits
            loss = F.cross_entropy(logits.float().flatten(0, 1), part[:, 1:].flatten()) / accum
            del logits  # else the next forward cannot reuse its memory: 1-3 % on CPU
            loss.backward()
        return loss

    # -- the transformers Trainer -----------------------------------------------------------

    def hf_setup(self, data: TaskData) -> tuple[Any, dict[str, Any], dict[str, Any]]:
        """(train dataset, extra TrainingArguments, extra Trainer arguments)."""
        return _HfBlocks(data.train), {"remove_unused_columns": False}, {}

    def hf_micro_loss(self, last: float, accum: int) -> float:
        # With accumulation the Trainer divides each micro-batch's loss by the whole step's
        # tokens (the model takes num_items_in_batch).
        return last * accum


@benchmarks
class ClassificationBench(TaskBench):
    """Padded rows, length-grouped steps, each micro-batch padded to its longest row (a
    multiple of 8): throughput in samples, the work in tokens with and without padding."""

    measures = SequenceClassification
    unit = "samples"

    def step_work(self, rows, sizes: Sequence[int]) -> tuple[int, int]:
        from app.components.data.labelled.padded import padded_length

        lengths = torch.sort(rows.lengths, descending=True).values.tolist()
        padded, offset = 0, 0
        for n in sizes:
            padded += n * padded_length(lengths[offset], rows.max_length)
            offset += n
        return sum(lengths), padded

    # -- the bare loop ----------------------------------------------------------------------

    def bare_sampler(self, data: TaskData) -> Callable[[int], torch.Tensor]:
        """step -> the step's sample indices: the trainer's length-grouped order (a pure
        function of seed and step), so the floor pads exactly what the trainer pads."""
        from app.components.data.loader import StepDataset

        d = self.cfg.data
        order = StepDataset(
            data.train,
            self.cfg.training.effective_batch_size,
            d.seed,
            lengths=data.train_lengths if d.length_grouping else None,
            group_steps=d.group_steps,
        )
        return order.step_indices

    def bare_backward(self, model, rows, micro: int, accum: int, amp, dev) -> torch.Tensor:
        """Longest rows first, each micro-batch cut to its longest row (a multiple of 8);
        cross-entropy summed and divided by the step's samples."""
        from app.components.data.labelled.padded import padded_length

        order = torch.sort(rows.lengths, descending=True, stable=True).indices
        samples = len(rows)
        for i in range(accum):
            pick = order[i * micro : (i + 1) * micro]
            lengths = rows.lengths[pick]
            width = padded_length(int(lengths.max()), rows.max_length)
            inputs = {
                "input_ids": rows.input_ids[pick, :width].to(dev, torch.long, non_blocking=True),
                "attention_mask": (torch.arange(width) < lengths[:, None]).to(dev, torch.long),
            }
            if rows.token_type_ids is not None:
                types = rows.token_type_ids[pick, :width]
                inputs["token_type_ids"] = types.to(dev, torch.long, non_blocking=True)
            labels = rows.labels[pick].to(dev, non_blocking=True)
            with amp:
                logits = model(**inputs).logits
            loss = F.cross_entropy(logits.float(), labels, reduction="sum") / samples
            del logits
            loss.backward()
        return loss

    # -- the transformers Trainer -----------------------------------------------------------

    def hf_setup(self, data: TaskData) -> tuple[Any, dict[str, Any], dict[str, Any]]:
        """As a Trainer user would: a tokenized `datasets.Dataset` of unpadded rows, the
        tokenizer, `DataCollatorWithPadding(pad_to_multiple_of=8)` and length grouping."""
        import datasets
        from transformers import DataCollatorWithPadding

        rows = data.train
        lengths = rows.lengths.tolist()
        columns = {"input_ids": _unpadded(rows.input_ids, lengths)}
        if rows.token_type_ids is not None:
            columns["token_type_ids"] = _unpadded(rows.token_type_ids, lengths)
        columns["labels"] = rows.labels.tolist()
        datasets.disable_progress_bars()
        tokenizer = data.info["tokenizer"]
        if tokenizer is None:  # classification data always carries the one it was made with
            raise TypeError("classification data without its tokenizer")
        collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8)
        return (
            datasets.Dataset.from_dict(columns),
            {"train_sampling_strategy": "group_by_length"},  # `group_by_length=True` before v5
            {"processing_class": tokenizer, "data_collator": collator},
        )

    def hf_micro_loss(self, last: float, accum: int) -> float:
        # The classifier returns its micro-batch mean and, taking **kwargs, counts as accepting
        # num_items_in_batch, so the Trainer does not divide it by the accumulation steps.
        return last


def _unpadded(padded: torch.Tensor, lengths: list[int]) -> list[list[int]]:
    return [row[:n] for row, n in zip(padded.tolist(), lengths, strict=True)]


class _HfBlocks:
    """Packed blocks as the Trainer wants them; the model shifts the labels itself."""

    def __init__(self, blocks) -> None:
        self.blocks = blocks

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> dict[str, Any]:
        x = self.blocks[i, :-1]
        return {"input_ids": x, "labels": x}
