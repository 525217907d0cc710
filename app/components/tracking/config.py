"""The `tracking` node: one entry per tracker beside TensorBoard and metrics.jsonl."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from app.components.tracking.mlflow_sink import MlflowConfig
from app.components.tracking.wandb_sink import WandbConfig


@dataclass
class TrackingConfig:
    """Experiment trackers beside TensorBoard and metrics.jsonl (app/components/tracking/)."""

    wandb: WandbConfig = field(default_factory=WandbConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)

    def check(self) -> None:
        """Each tracker's node checks itself: a new tracker is its field here, nothing more."""
        for node in dataclasses.fields(self):
            getattr(self, node.name).check()
