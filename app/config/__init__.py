"""The typed config: the root schema assembled from the components' configs, loaded once at the
entry (`load_config`); below it, code takes typed slices, never a DictConfig."""

from app.components.data.config import DataConfig
from app.components.hardware.config import GpuConfig, PrecisionConfig
from app.components.models.config import ModelConfig
from app.components.tasks.config import TaskConfig
from app.components.tracking.config import TrackingConfig
from app.config.hpo import HpoConfig
from app.config.schema import TrainConfig, load_config, register_configs
from app.config.training import AutoBatchConfig, FaultsConfig, ProfilerConfig, TrainingConfig
from app.core.errors import ConfigError

__all__ = [
    "AutoBatchConfig",
    "ConfigError",
    "DataConfig",
    "FaultsConfig",
    "GpuConfig",
    "HpoConfig",
    "ModelConfig",
    "PrecisionConfig",
    "ProfilerConfig",
    "TaskConfig",
    "TrackingConfig",
    "TrainConfig",
    "TrainingConfig",
    "load_config",
    "register_configs",
]
