"""The root config: one typed node per Hydra group, assembled from the components' configs.

The schema is registered in Hydra's ConfigStore, so a misspelled key or a wrong type is refused
while Hydra composes. `load_config` turns the composed `DictConfig` into typed dataclasses once,
at the entry; below it every function takes the slice it needs (`config.training`, not the
tree). Each group checks itself (bounds and choices declared on its fields, then what spans its
fields); `TrainConfig.check` adds what spans groups (the model fits the task, the sequence fits
the positions). Every refusal is a ConfigError: one line naming the setting and what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from app.components.data.config import DataConfig
from app.components.hardware.config import GpuConfig, PrecisionConfig
from app.components.models.config import ModelConfig
from app.components.tasks.config import TaskConfig
from app.components.tracking.config import TrackingConfig
from app.config.budget import TrainBudget, budget_of, check_budget
from app.config.hpo import HpoConfig
from app.config.keys import check_known_keys
from app.config.training import FaultsConfig, TrainingConfig
from app.core.errors import ConfigError, first_line
from app.core.fields import check_fields


@dataclass
class TrainConfig:
    gpu: GpuConfig = MISSING
    precision: PrecisionConfig = MISSING
    data: DataConfig = MISSING
    model: ModelConfig = MISSING
    training: TrainingConfig = MISSING
    task: TaskConfig = field(default_factory=TaskConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    hpo: HpoConfig | None = None  # set by hpo=optuna; read by the sweeper and the trial reporter
    # summary.json key main() returns, or a list of keys for multi-objective studies (untyped:
    # OmegaConf types no union of a string and a list; `objective_keys` is the typed value)
    objective: Any = "final_val_loss"

    def __post_init__(self) -> None:
        # What check() refuses reads as no key here: load_config checks before any use.
        keys = _keys(self.objective)
        self.objective_keys: str | list[str] = [] if keys is None else keys

    def check(self) -> None:
        """Every check of the config alone, before any work: each group's, then across groups."""
        for name in ("gpu", "precision", "data", "model", "training", "task", "faults", "tracking"):
            check_fields(getattr(self, name), name)
        if _keys(self.objective) is None:
            raise ConfigError(
                f"objective={self.objective!r} must be a summary.json key or a list of them"
            )
        self.task.check()
        self._check_preset_precision()
        self._check_fits_task()
        self.data.check()
        self.training.check()
        check_budget(self.training, self.tokens_per_sample())
        self.tracking.check()

    def tokens_per_sample(self) -> int | None:
        """Every sample's tokens where the task packs them into blocks of one length (a budget
        in tokens is then a number of samples); None where samples vary in length."""
        from app.components.tasks import TASKS

        task = TASKS.get(self.task.name)
        return task(self.task).sequence_length(self.data) if task.packed else None

    def budget(self) -> TrainBudget:
        """The run's steps, schedule and learning rate at its effective batch."""
        return budget_of(self.training, self.tokens_per_sample())

    def _check_preset_precision(self) -> None:
        """bf16/TF32 asked of a CUDA preset that lacks it: caught without touching a device."""
        gpu, requested = self.gpu, self.precision.name
        if gpu.device_type != "cuda" or requested not in ("bf16", "tf32"):
            return
        if not (gpu.bf16 if requested == "bf16" else gpu.tf32):
            raise ConfigError(
                f"precision={requested} is not supported by gpu={gpu.name} (compute capability "
                f"{gpu.compute_capability}, needs >= 8.0); use precision=fp16 or precision=auto"
            )

    def _check_fits_task(self) -> None:
        """The model family builds the head the task trains and the data source gives the
        samples it reads (what each declares, not lists of names); then their own checks."""
        from app.components.data.sources import SOURCES
        from app.components.models.families import MODELS
        from app.components.tasks import TASKS

        task = TASKS.get(self.task.name)(self.task)
        family = MODELS.get(self.model.arch)
        if not family.builds(task.head):
            noun = family.heads[0].noun if family.heads else "no model"
            archs = [f.name for f in MODELS.all() if f.builds(task.head)]
            raise ConfigError(
                f"model.arch={family.name!r} is {noun}, not a model for task={task.name}, which "
                f"trains {task.head.noun}; choose one of: {', '.join(archs)}"
            )
        source = SOURCES.get(self.data.source)
        if task.reads not in source.gives:
            gives = " or ".join(k.name for k in source.gives) or "nothing"
            served = [s.name for s in SOURCES.all() if task.reads in s.gives]
            raise ConfigError(
                f"data.source={source.name!r} does not serve task={task.name}, which reads "
                f"{task.reads.name} ({source.name} gives {gives}); choose one of: "
                f"{', '.join(served)}"
            )
        source.check(self.data, task)
        family.check(self.model, task.sequence_setting, task.sequence_length(self.data))


def _keys(objective: object) -> str | list[str] | None:
    """The objective's summary.json key(s); None where it is neither a key nor a list of keys."""
    if isinstance(objective, str):
        return objective
    if isinstance(objective, list) and all(isinstance(k, str) for k in objective):
        return list(objective)
    return None


def load_config(cfg: DictConfig) -> TrainConfig:
    """The composed config, typed and checked: what every run works from."""
    check_known_keys(cfg)
    try:
        config = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None)
        raise ConfigError(f"{key}: {first_line(exc)}" if key else first_line(exc)) from None
    if not isinstance(config, TrainConfig):
        raise ConfigError(f"the config is a {type(config).__name__}, not a training run's")
    config.check()
    return config


def model_tokenizer(fallback: str, *, _root_: DictConfig) -> str | None:
    """`data.tokenizer: ${model_tokenizer:byte}`: a pretrained model's own tokenizer (its
    model.path), else `fallback` for a model trained from scratch. Without it the default data
    would feed byte ids to a BPE model; a tokenizer set explicitly still wins."""
    from app.components.models.families import MODELS

    arch = OmegaConf.select(_root_, "model.arch", default=None)
    if arch in MODELS.names() and MODELS.get(arch).loads_checkpoint:
        return OmegaConf.select(_root_, "model.path", default=None)
    return fallback


if not OmegaConf.has_resolver("model_tokenizer"):
    OmegaConf.register_new_resolver("model_tokenizer", model_tokenizer)


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
