"""The `training` group and the `faults` node: how the engine trains, and the faults it injects.

Every default is here, once: conf/training/default.yaml sets nothing these do not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.components.hardware.host_malloc import HOST_MALLOC_POLICIES
from app.core.errors import ConfigError
from app.core.fields import (
    auto_count,
    auto_or_count,
    bounded,
    count,
    fraction,
    one_of,
    positive_int,
)

SCHEDULES = ("cosine", "linear", "constant")
FAULT_PHASES = ("forward", "backward", "optimizer", "eval")
PARALLELISMS = ("ddp", "fsdp")
LR_SCALINGS = ("none", "sqrt", "linear")  # app/config/budget.py applies them
DEFAULT_BUDGETS = ("steps", "data")  # app/config/budget.py resolves them
BATCH_SCHEDULES = ("fixed", "adaptive")  # app/engine/train/batch_growth.py follows adaptive


def _optimizers() -> tuple[str, ...]:
    from app.components.optim import OPTIMIZERS

    return OPTIMIZERS.names()


@dataclass
class AutoBatchConfig:
    """How training.micro_batch_size=auto is resolved (see app/engine/batch/probe.py)."""

    max_micro_batch: int = positive_int(1024)
    max_probe_steps: int = positive_int(40)
    max_probe_seconds: float = bounded(120.0, low=0.0, low_open=True)
    throughput_aware: bool = True
    cache: bool = True
    cache_dir: str | None = None  # null: <data.cache_dir>/autobatch
    cpu_max_micro_batch: int = positive_int(64)
    cpu_memory_fraction: float = fraction(0.5, low_open=True)
    oom_recovery: bool = True


@dataclass
class AdaptiveBatchConfig:
    """training.batch_schedule=adaptive's rule (app/engine/batch_schedule.py): double the
    effective batch when the smoothed gradient noise scale has stayed at or above
    `noise_fraction` x the batch for `patience_steps` steps of training.reference_batch."""

    noise_fraction: float = bounded(1.0, low=0.0, low_open=True)
    # 10 x the reference batch (320 samples in the batch-size sweep): on the one-epoch bench
    # 25 left the 30 % fewer steps unmet on a seed where 10 met it within 1 % (docs/benchmarks.md)
    patience_steps: int = count(10)
    # The noise scale's moving-average factor per optimizer step while the rule reads it (the
    # log line's is 0.95, about 20 steps of memory): a decision needs a steadier estimate, and
    # with memory counted in steps it lags more at a grown batch, which spaces out the doublings
    # (docs/benchmarks.md measured 0.95, 0.99 and 0.995).
    smoothing: float = fraction(0.995, high_open=True)


@dataclass
class ProfilerConfig:
    """A torch.profiler window over optimizer steps (app/engine/records/profiling.py);
    steps=0: off."""

    steps: int = count(0)  # how many optimizer steps to record
    start_step: int = count(5)  # the first of them, after the warm-up steps
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False


@dataclass
class FsdpConfig:
    """training.parallelism=fsdp (app/engine/parallel/fsdp.py): FSDP2 per transformer block
    and root."""

    # Free each block's gathered weights after its forward and gather them again for its
    # backward (the least memory); false keeps them until the backward: one all-gather fewer
    # per block and step, at the memory of the whole unsharded model.
    reshard_after_forward: bool = True


@dataclass(frozen=True)
class EvalMicroBatch:
    """training.eval_micro_batch_size as the engine reads it: `size` where an int is set;
    `scaled` for auto, a multiple of the training micro-batch (app/engine/batch_plan.py);
    neither for null, the training micro-batch itself."""

    size: int | None = None
    scaled: bool = False


@dataclass(frozen=True)
class ResumeFrom:
    """training.resume as the engine reads it, where it is set: `path` (a run directory, its
    checkpoints/, a checkpoint), or None for auto, this run directory's own latest checkpoint."""

    path: str | None = None


@dataclass
class TrainingConfig:
    """The settings as Hydra takes them. The ones that are a word or a number (OmegaConf types
    no such union, so their fields take any value) are typed once, as the config is built
    (`__post_init__`, run by load_config): the engine reads `fixed_micro_batch`,
    `eval_micro_batch` and `resume_from`, never the words."""

    effective_batch_size: int = positive_int(32)  # samples per optimizer step, all ranks
    # auto (probed on the device, cached per shape) | an int that fixes it
    micro_batch_size: Any = "auto"
    # The run's budget, one of three (app/config/budget.py): optimizer steps, samples, or
    # tokens (tasks of packed blocks); none set: default_budget below. Under a data
    # budget the steps follow from the effective batch, and the step counts below are steps of
    # reference_batch, so runs of any batch warm up, evaluate and checkpoint at equal data.
    max_steps: int | None = positive_int(None, nullable=True)
    max_samples: int | None = positive_int(None, nullable=True)
    max_tokens: int | None = positive_int(None, nullable=True)
    # The budget when none of the three is set: steps, 300 optimizer steps; data, the data
    # 300 steps of reference_batch see, in tokens where the task packs its
    # samples into blocks and in samples where it pads them, so runs of every batch size see
    # the same data. hpo=optuna sets data: its trials are compared at equal data unless a
    # budget above is set (a command line's, an experiment's or a sweep file's).
    default_budget: str = one_of("steps", DEFAULT_BUDGETS)
    # The batch that training.lr and the step counts of a data budget are written for.
    reference_batch: int = positive_int(32)
    # none | sqrt | linear: training.lr is the LR at reference_batch, scaled to the run's batch.
    lr_scaling: str = one_of("none", LR_SCALINGS)
    # Estimate the gradient noise scale B_simple (McCandlish et al. 2018), which predicts the
    # critical batch size, from the gradients each step already has
    # (app/engine/records/noise_scale.py).
    noise_scale: bool = False
    # fixed | adaptive: adaptive starts at effective_batch_size and doubles it (through
    # accumulation) as the measured noise scale grows (adaptive_batch's rule), up to
    # max_effective_batch, the learning rate following lr_scaling at each change. It measures the
    # noise scale whatever noise_scale says, and needs a budget in data (the steps follow).
    batch_schedule: str = one_of("fixed", BATCH_SCHEDULES)
    max_effective_batch: int | None = positive_int(None, nullable=True)  # null: 8 x the start
    adaptive_batch: AdaptiveBatchConfig = field(default_factory=AdaptiveBatchConfig)
    # An optimizer of app/components/optim/ (adamw, lion, ...) and its own settings, a
    # mapping of the fields of that optimizer's Args (e.g. {beta2_decay: -0.8} for adafactor):
    # untyped here, since only the optimizer knows its fields; it parses them into its Args.
    optimizer: str = one_of("adamw", _optimizers)
    optimizer_args: Any = None
    # The optimizers here move each weight by about lr per step whatever the gradient's scale:
    # above 1 every weight moves by more than its size.
    lr: float = bounded(3e-3, low=0.0, high=1.0, low_open=True)
    min_lr_ratio: float = fraction(0.1)  # the schedule ends at lr * min_lr_ratio
    schedule: str = one_of("cosine", SCHEDULES)
    warmup_steps: int = count(20)
    weight_decay: float = bounded(0.1, low=0.0)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = bounded(1e-8, low=0.0, high=1.0, low_open=True, high_open=True)
    fused_adamw: bool | None = None  # null: fused (CUDA, and CPU since torch 2.4)
    max_grad_norm: float = bounded(1.0, low=0.0)  # 0 disables clipping
    eval_every: int = positive_int(50)
    # Validation sequences (the first N blocks of the held-out split; fewer if it is smaller).
    # Fixed in samples, not batches, so trials with different micro-batches score the same set.
    eval_samples: int = positive_int(128)
    # Evaluation micro-batch: null = the training micro-batch; auto = EVAL_FACTOR times it (no
    # backward, no saved activations: it fits, and the probe checks that it does); or an int.
    eval_micro_batch_size: Any = None
    eval_at_start: bool = True  # a step-0 validation loss to compare the end against
    log_every: int = positive_int(10)
    checkpoint_every: int = count(100)  # 0: only at the end
    keep_checkpoints: int = positive_int(2)
    seed: int = count(1337)
    resume: str | None = None  # null | auto (this run dir) | path to a run dir or checkpoint
    progress_bar: bool = True
    # Host malloc policy (app/components/hardware/host_malloc.py): retain | default. retain keeps
    # freed memory for the next step instead of page-faulting it back in from the kernel.
    host_malloc: str = one_of("retain", HOST_MALLOC_POLICIES)
    # PYTORCH_CUDA_ALLOC_CONF's expandable_segments (app/components/hardware/cuda_alloc.py):
    # true or false is merged into the variable before CUDA starts; null leaves the environment's.
    expandable_segments: bool | None = None
    # torch.cuda.empty_cache() after each evaluation (CUDA only): hands the evaluation's cached
    # blocks back to the driver, at the cost of allocating them again in the next steps.
    empty_cache_after_eval: bool = False
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)
    # Write <run dir>/model (Hugging Face format: config, safetensors, tokenizer) when the run
    # completes; `python -m app.export` writes it from any checkpoint too.
    export: bool = True
    auto_batch: AutoBatchConfig = field(default_factory=AutoBatchConfig)
    # Under torchrun (docs/scaling.md, "More GPUs"): ddp, every rank holds the whole model;
    # fsdp, the weights, gradients and optimizer state are sharded over the ranks, checkpoints too.
    parallelism: str = one_of("ddp", PARALLELISMS)
    fsdp: FsdpConfig = field(default_factory=FsdpConfig)
    # Under torchrun, how long a rank waits in a collective for its peers before it ends the run
    # with one line naming itself and its phase (docs/scaling.md, "A rank that stops
    # answering"). null: 60 s for a sweep's trial on several ranks (a hung trial idles all of
    # its GPUs), 600 s for a torchrun run (NCCL's own default; long enough for rank 0's
    # checkpoint write or a slower rank's compile while the others wait).
    peer_timeout_s: float | None = bounded(
        None, low=0.0, high=86400.0, low_open=True, nullable=True
    )

    def __post_init__(self) -> None:
        # What check() refuses is read as the default here: load_config checks before any use.
        self.fixed_micro_batch: int | None = auto_count(self.micro_batch_size)  # None: probed
        self.eval_micro_batch = EvalMicroBatch(
            size=auto_count(self.eval_micro_batch_size),
            scaled=self.eval_micro_batch_size == "auto",
        )
        resume = self.resume
        self.resume_from: ResumeFrom | None = (
            None if resume is None else ResumeFrom(None if resume == "auto" else resume)
        )

    def check(self) -> None:
        self._check_batch()
        from app.components.optim import OPTIMIZERS

        optimizer = OPTIMIZERS.get(self.optimizer)
        optimizer.check(self)
        if self.parallelism == "fsdp" and not optimizer.steps_shards:
            able = ", ".join(n for n in OPTIMIZERS.names() if OPTIMIZERS.get(n).steps_shards)
            raise ConfigError(
                f"training.optimizer={self.optimizer} cannot step the sharded parameters of "
                f"training.parallelism=fsdp; allowed with fsdp: {able}"
            )
        self._check_noise_scale()
        self._check_batch_schedule()

    @property
    def measures_noise(self) -> bool:
        """The gradient noise scale is estimated: asked for, or the adaptive schedule reads it."""
        return self.noise_scale or self.batch_schedule == "adaptive"

    @property
    def batch_cap(self) -> int:
        """The largest effective batch the run may train at."""
        if self.batch_schedule == "fixed":
            return self.effective_batch_size
        return self.max_effective_batch or 8 * self.effective_batch_size

    def _check_noise_scale(self) -> None:
        if not self.measures_noise:
            return
        why = (
            "training.noise_scale=true"
            if self.noise_scale
            else "training.batch_schedule=adaptive (it reads the gradient noise scale)"
        )
        if self.parallelism == "fsdp":
            raise ConfigError(
                f"{why} needs each rank's local gradient, which training.parallelism=fsdp "
                "shards as it reduces; allowed with fsdp: "
                + ("false" if self.noise_scale else "fixed")
            )
        fixed = self.fixed_micro_batch
        if self.effective_batch_size < 2:
            raise ConfigError(
                f"{why} compares two batch sizes, but training.effective_batch_size=1 cannot be "
                "split; allowed: an effective batch >= 2"
            )
        if fixed is not None and fixed >= self.effective_batch_size:
            raise ConfigError(
                f"{why} compares one micro-batch's gradient with the whole step's, but "
                f"training.micro_batch_size={fixed} is the whole effective batch; allowed: "
                f"1..{self.effective_batch_size - 1} (or auto)"
            )

    def _check_batch_schedule(self) -> None:
        cap = self.max_effective_batch
        if cap is not None and cap < self.effective_batch_size:
            raise ConfigError(
                f"training.max_effective_batch={cap} is below training.effective_batch_size="
                f"{self.effective_batch_size}; allowed: null or >= {self.effective_batch_size}"
            )

    def _check_batch(self) -> None:
        micro, fixed = self.micro_batch_size, self.fixed_micro_batch
        auto_or_count("training.micro_batch_size", micro, 1, "auto or a positive integer")
        if fixed is not None and fixed > self.effective_batch_size:
            raise ConfigError(
                f"training.micro_batch_size={micro} is larger than "
                f"training.effective_batch_size={self.effective_batch_size}; allowed: auto or "
                f"1..{self.effective_batch_size}"
            )
        auto_or_count(
            "training.eval_micro_batch_size",
            self.eval_micro_batch_size,
            1,
            "null (the training micro-batch), auto or a positive integer",
            nullable=True,
        )


@dataclass
class FaultsConfig:
    """Fault injection for tests and CPU users: see docs/training.md, 'Fault injection'."""

    oom_above_micro_batch: int | None = bounded(None, low=0, integer=True, nullable=True)
    oom_phase: str = one_of("forward", FAULT_PHASES)
    oom_from_step: int = count(0)  # first optimizer step at which the fault fires
    # under torchrun: only this rank fails (null: every rank)
    oom_rank: int | None = bounded(None, low=0, integer=True, nullable=True)
    # SIGKILL while writing the checkpoint of this step, once this rank's part is on disk and
    # before the checkpoint is complete: what a crash mid-write leaves behind (tests).
    kill_in_checkpoint: int | None = bounded(None, low=1, integer=True, nullable=True)
    kill_rank: int | None = bounded(None, low=0, integer=True, nullable=True)  # null: every rank
    # Rank `hang_rank` stops answering before `hang_phase` of optimizer step `hang_step`: it
    # sleeps forever, a stop signal noted and never acted on, as in a rank stuck in a driver
    # call; its peers wait in a collective until training.peer_timeout_s (tests). null: none.
    hang_rank: int | None = bounded(None, low=0, integer=True, nullable=True)
    hang_step: int = count(1)
    hang_phase: str = one_of("forward", FAULT_PHASES)
