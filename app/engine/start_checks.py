"""Checks of the machine and the files a run will use, done before anything is written.

`TrainConfig.check` judges a config on its own; these look outside it: the run directory can be
written, the files each component will read hold what it needs, the model's state and one
step's batch fit the memory there is, and a checkpoint to resume belongs to this model. Each
failure is a ConfigError naming the setting. The preflight of `python -m app.train` runs them
before Hydra creates the run directory, so a refused run leaves an existing directory exactly
as it was; the runner runs them again for sweep trials. Nothing here imports torch unless there
is a checkpoint to look at.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from app.components.data.sources import SOURCES
from app.components.hardware.memory import host_memory_bytes
from app.components.models.config import MupConfig
from app.components.models.families import MODELS
from app.components.models.pretrained_dir import looks_local
from app.components.optim import OPTIMIZERS
from app.components.tasks import build_task
from app.components.tasks.base import Task
from app.components.tracking.sinks import check_trackers
from app.config.budget import BudgetUnit
from app.config.recorded import saved_run_config
from app.core.errors import ConfigError

if TYPE_CHECKING:
    from app.config.schema import TrainConfig

GIB = 2**30
# One optimizer step's token ids live on the host (and a few more in the loader's prefetch).
STEP_BATCH_HOST_FRACTION = 0.1
WEIGHTS_AND_GRADS_BYTES_PER_PARAM = 8  # fp32 weights and gradients; the optimizer adds its own
# What a checkpoint must agree on with the run that resumes it, around its model family's
# own shape (ModelFamily.shape_keys).
TOKENIZER_KEYS = ("data.tokenizer", "data.tokenizer_vocab_size")
# How the width shapes the model (μP: its init scale, multipliers and rates per group): a
# checkpoint resumes only under the parametrization it was trained with.
PARAMETRIZATION_KEYS = ("model.parametrization",)
MUP_KEYS = tuple(f"model.mup.{f.name}" for f in dataclasses.fields(MupConfig))
# What a checkpoint written before a key existed was trained with (μP's attention scale was
# attn_mult / d_head before model.mup.base_head_dim: the same as a base head width of 1).
SHAPE_DEFAULTS = {
    "task.name": "causal_lm",
    "model.parametrization": "standard",
    "model.mup.base_head_dim": 1,
}
ABSENT = object()  # a key the checkpoint's record does not have (null is a value)


class AlreadyComplete(Exception):
    """`training.resume` points at a run that reached training.max_steps: nothing to do."""


def check_start(
    config: TrainConfig, run_dir: Path, device_type: str, device_total: int | None
) -> Path | None:
    """Every check of the machine and the files; returns the checkpoint to resume, if any.

    Raises ConfigError, or AlreadyComplete when the checkpoint is at max_steps already.
    """
    task = build_task(config.task)
    check_run_dir(run_dir)
    check_trackers(config.tracking)
    check_precision(config, device_type)
    MODELS.get(config.model.arch).check_files(config.model, config.data, task)
    check_tokenizer_path(config)
    task.check_vocab(config.model, config.data)
    SOURCES.get(config.data.source).check_files(config.data, task)
    check_step_batch(config, task, host_memory_bytes())
    usable = training_memory(config, device_type, device_total)
    if usable is not None:
        check_model_fits(config, usable, device_type)
    return resume_checkpoint(config, run_dir)


def check_run_dir(run_dir: Path, setting: str = "hydra.run.dir") -> None:
    """The run directory (or the closest parent that exists) must be writable."""
    probe = run_dir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ConfigError(f"{setting}={run_dir}: {probe} is a file, not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        why = "read-only file system" if _read_only_mount(probe) else "permission denied"
        raise ConfigError(
            f"{setting}={run_dir}: cannot write in {probe} ({why}); choose a writable directory"
        )


def _read_only_mount(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def check_tokenizer_path(config: TrainConfig) -> None:
    """A tokenizer named by a local path must be there (a hub name is checked when it loads:
    whether it can be fetched depends on the network)."""
    name = config.data.tokenizer
    if name and looks_local(str(name)) and not Path(str(name)).expanduser().exists():
        raise ConfigError(f"data.tokenizer={name}: no such file or directory")


def check_precision(config: TrainConfig, device_type: str) -> None:
    """What a CPU cannot do; a card's abilities are checked once it is detected."""
    name = config.precision.name
    if device_type == "cpu" and name in ("fp16", "tf32"):
        raise ConfigError(
            f"precision={name} needs a CUDA device; on CPU use precision=fp32, bf16 or auto"
        )


# ---------------------------------------------------------------------------------------------
# Memory


def check_step_batch(config: TrainConfig, task: Task, host_bytes: int) -> None:
    """One optimizer step's token ids must fit comfortably in host memory."""
    key = task.sequence_setting
    width = task.sequence_length(config.data) + 1
    batch = config.training.effective_batch_size
    step_bytes = batch * width * 8
    allowed = STEP_BATCH_HOST_FRACTION * host_bytes
    if step_bytes > allowed:
        raise ConfigError(
            f"training.effective_batch_size={batch}: one optimizer step holds "
            f"{step_bytes / GIB:,.1f} GiB of token ids (x {width} tokens x 8 bytes), more than "
            f"{allowed / GIB:.1f} GiB (a tenth of this machine's {host_bytes / GIB:.1f} GiB); "
            f"lower it or data.{key}"
        )


def check_model_fits(config: TrainConfig, memory_bytes: int, where: str) -> None:
    """Weights, gradients and the optimizer's state must fit before a single activation does."""
    m = config.model
    vocab = m.vocab_size or 256  # the smallest tokenizer: errs on the side of running
    params = MODELS.get(m.arch).parameters(m, vocab)
    if params is None:
        return
    optimizer = OPTIMIZERS.get(config.training.optimizer)
    need = params * (WEIGHTS_AND_GRADS_BYTES_PER_PARAM + optimizer.state_bytes_per_param)
    # FSDP shards all three over the ranks (torchrun sets WORLD_SIZE before this runs).
    ranks = int(os.environ.get("WORLD_SIZE", "1")) if config.training.parallelism == "fsdp" else 1
    if need / ranks > memory_bytes:
        share = (
            f", {need / ranks / GIB:,.1f} GiB per rank over {ranks} FSDP ranks" if ranks > 1 else ""
        )
        raise ConfigError(
            f"model.n_layer={m.n_layer}, model.n_embd={m.n_embd}: about {params / 1e9:,.2f}B "
            f"parameters need {need / GIB:,.1f} GiB for fp32 weights, gradients and "
            f"{optimizer.label} state{share}, more than the {memory_bytes / GIB:.1f} GiB usable "
            f"on {where}; use a smaller model"
        )


def training_memory(config: TrainConfig, device_type: str, total_bytes: int | None) -> int | None:
    """What a run may use for its model state on this device (None: unknown, not checked)."""
    if device_type == "cpu":
        return int(host_memory_bytes() * config.training.auto_batch.cpu_memory_fraction)
    if total_bytes is None:
        return None
    return int(total_bytes * (1.0 - config.gpu.memory_headroom))


# ---------------------------------------------------------------------------------------------
# Resume


def resume_checkpoint(config: TrainConfig, run_dir: Path) -> Path | None:
    """The checkpoint training.resume names, checked against this run (None: a fresh start)."""
    t = config.training
    if t.resume_from is None:
        return None
    from app.engine.saving import (
        checkpoint as ckpt,  # torch: only when there is a checkpoint to look at
    )

    found = ckpt.find_resume_checkpoint(t.resume_from, run_dir)
    if found is None:
        return None
    state = ckpt.load_checkpoint(found, mmap=True)
    saved = saved_run_config(found, state.config)
    check_resume_matches(config, found, saved)
    budget = config.budget()
    check_resume_batch(config, found, saved, budget.unit)
    from app.engine.train.batch_growth import resumed_budget

    budget = resumed_budget(budget, state.batch_schedule, config.training)  # the steps it took
    if int(state.step) >= budget.max_steps:
        steps = "" if budget.unit is BudgetUnit.STEPS else f", {budget.max_steps} steps"
        raise AlreadyComplete(
            f"{found} is at step {int(state.step)} of {budget.setting}={budget.total}{steps}: "
            f"the run is complete, nothing to do (raise {budget.setting} to train further)"
        )
    return found


def model_identity(config: TrainConfig) -> dict[str, object]:
    """The settings that shape the model, saved in each checkpoint (shape_keys are among them)."""
    return {
        "task": dataclasses.asdict(config.task),
        "model": dataclasses.asdict(config.model),
        "data": dataclasses.asdict(config.data),
        # A checkpoint's step counts data only at its batch (a data budget's resume checks it)
        "training": {"effective_batch_size": config.training.effective_batch_size},
    }


def check_resume_matches(
    config: TrainConfig, checkpoint: Path, saved: Mapping[str, object] | None
) -> None:
    """The settings that shape the model must be those the checkpoint was trained with."""
    if saved is None:
        return
    now = model_identity(config)
    for key in shape_keys(config):
        old = _select(saved, key, ABSENT)
        old = SHAPE_DEFAULTS.get(key) if old is ABSENT else old
        new = _select(now, key)
        if old != new:
            raise ConfigError(
                f"training.resume={checkpoint}: the checkpoint was trained with {key}="
                f"{_shown(old)}, this run has {key}={_shown(new)}; resume with the same model or "
                "start a new run"
            )


def _shown(value: object) -> str:
    return "null" if value is None else str(value)


def shape_keys(config: TrainConfig) -> tuple[str, ...]:
    """The task, the model family's shape, its parametrization and the tokenizer: what fixes
    the model's tensors and what they mean."""
    mup = MUP_KEYS if config.model.parametrization == "mup" else ()
    family = MODELS.get(config.model.arch).shape_keys()
    return ("task.name", *family, *PARAMETRIZATION_KEYS, *mup, *TOKENIZER_KEYS)


def check_resume_batch(
    config: TrainConfig, checkpoint: Path, saved: Mapping[str, object] | None, unit: BudgetUnit
) -> None:
    """Under a data budget a checkpoint's step is data seen only at the batch it trained with:
    resumed at another, the data seen and the marks reported would be wrong."""
    old = _select(saved or {}, "training.effective_batch_size")
    new = config.training.effective_batch_size
    if unit is not BudgetUnit.STEPS and old is not None and old != new:
        raise ConfigError(
            f"training.resume={checkpoint}: the checkpoint was trained with "
            f"training.effective_batch_size={old}, this run has {new}; a budget in {unit} "
            f"resumes only at the same batch: set training.effective_batch_size={old}"
        )


def _select(tree: Mapping[str, object], dotted: str, absent: object = None) -> object:
    """The value at a dotted key, or `absent`."""
    node: object = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return absent
        node = node[part]
    return node
