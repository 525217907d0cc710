"""What one training run is made of, in typed homes: the machine it runs on, the model's fixed
facts, where it reports, and the `Run` the loop trains (built by app/engine/runner.py, or by a
test with fakes)."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

from app.components.hardware.config import GpuConfig
from app.components.hardware.devices import DeviceInfo
from app.components.hardware.precision import PrecisionPlan
from app.components.tasks.base import Task
from app.config.budget import TrainBudget
from app.config.training import TrainingConfig
from app.core.preemption import StopRequest
from app.engine.batch_plan import BatchPlan
from app.engine.batch_schedule import BatchGrowth
from app.engine.comms.agreement import Agreement
from app.engine.comms.distributed import DistInfo
from app.engine.faults import FaultInjector
from app.engine.records.noise_scale import NoiseScale
from app.hpo import NullReporter, Reporter

if TYPE_CHECKING:
    from app.engine.records.telemetry import RunLogger


class Samples(Protocol):
    """Samples as the engine handles them, counted and sliced but never looked into: packed
    blocks (a tensor) or padded rows; the task turns them into inputs and targets."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: slice, /) -> Samples: ...


class Inputs(Protocol):
    """A micro-batch's model inputs as the engine handles them: a tensor, or a task's own type
    that moves to a device as one."""

    def __len__(self) -> int: ...

    def to(self, device: torch.device, /, *, non_blocking: bool = ...) -> Inputs: ...


@dataclass
class Machine:
    """The device this run trains on, the preset that applies to it, the precision resolved for
    it and the torchrun ranks: resolved once by the runner, read by the probe and its cache."""

    device: DeviceInfo
    preset: GpuConfig  # the gpu preset that applies to this device
    precision: PrecisionPlan
    dist: DistInfo = field(default_factory=DistInfo)
    warnings: list[str] = field(default_factory=list)  # the banner's and summary.json's

    @property
    def torch_device(self) -> torch.device:
        return self.device.torch_device


class StepHooks:
    """Callbacks around each optimizer step; they do nothing unless overridden (a benchmark's
    clock, a test that watches the micro-batches or changes the plan mid-run)."""

    def on_step_start(self, run: Run, step: int, batch: Samples) -> None:
        """Before optimizer step `step` over `batch` (this rank's samples), once."""

    def on_attempt(self, run: Run, step: int) -> None:
        """Before each attempt at the step: again when it is redone after an OOM."""

    def on_step_end(self, run: Run, step: int) -> None:
        """After the step's optimizer update."""

    def on_oom(self, run: Run, step: int) -> None:
        """After an out-of-memory error was caught and its memory released, before the redo."""


@dataclass
class Observers:
    """Where a run reports to; each is optional and does nothing by default."""

    logger: RunLogger | None = None  # TensorBoard + metrics.jsonl, on the main rank
    reporter: Reporter = field(default_factory=NullReporter)  # the HPO trial, if any
    on_plan_change: Callable[[BatchPlan], None] | None = None  # OOM recovery teaches the cache
    stop: StopRequest = field(default_factory=StopRequest)  # set by SIGTERM/SIGINT
    hooks: StepHooks = field(default_factory=StepHooks)


@dataclass
class ModelFacts:
    """Fixed facts about the model: throughput figures and what checkpoints record."""

    num_params: int = 0  # N of the FLOPs formula (app/components/models/shape.py)
    flops_per_token: int | None = None
    peak_tflops: float | None = None  # of this device at this precision; None: MFU unknown
    identity: dict[str, object] = field(default_factory=dict)  # the settings that shape it
    tokenizer: str | None = None  # the fingerprint of <run dir>/tokenizer (app/cli/export.py)
    # This rank's parameters, gradients and optimizer state in bytes, measured on its tensors
    # (FSDP: its shards) after the first optimizer step (app/engine/parallel/rank_memory.py).
    state_bytes: dict[str, int] | None = None


@dataclass
class Run:
    """Everything one training run needs, built by the runner (or a test) and handed to train()."""

    model: torch.nn.Module  # what runs forward: maybe compiled and/or DDP-wrapped (or FSDP)
    raw_model: torch.nn.Module  # what is saved and restored (FSDP: the sharded model itself)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    plan: BatchPlan
    precision: PrecisionPlan
    device: torch.device
    cfg: TrainingConfig
    steps: Iterator[Samples]  # this rank's host step batches
    val_blocks: Samples  # validation samples: packed blocks (causal LM) or padded rows
    run_dir: Path
    task: Task
    budget: TrainBudget  # its steps, schedule and learning rate at its effective batch
    scaler: torch.amp.GradScaler | None = None
    faults: FaultInjector = field(default_factory=FaultInjector)
    dist: DistInfo = field(default_factory=DistInfo)
    start_step: int = 0  # optimizer steps already done (a resumed run)
    observers: Observers = field(default_factory=Observers)
    facts: ModelFacts = field(default_factory=ModelFacts)
    agreement: Agreement = field(default_factory=Agreement)  # ranks agreeing on OOMs
    noise: NoiseScale | None = None  # training.noise_scale: the gradient noise scale
    growth: BatchGrowth | None = None  # training.batch_schedule=adaptive

    def release_model(self) -> None:
        """The model and its optimizer let go while the process group is registered (the run
        ends with them). DDP's reducer dropped after the group would destroy it holding the GIL
        that gloo's worker thread may need to free a finished collective's tensors (a hang at
        exit, about 1 run in 10); FSDP's modules and the optimizer's DTensors hold the group
        too, in reference cycles that only a collection frees. Once they are gone, shutdown()
        frees the group and joins its threads while Python still serves them
        (app/engine/comms/distributed.py: release_mesh_groups)."""
        del self.model, self.raw_model, self.optimizer, self.scheduler
        if self.dist.enabled or self.dist.owns_group:
            gc.collect()  # a full collection (~0.15 s): only where a process group holds it
