"""Where a run's records go: TensorBoard and metrics.jsonl always, W&B and MLflow when asked.

`build_sinks` turns the `tracking` config node into sinks (app/tracking/base.py) that RunLogger
fans out to, on the main rank only. The trackers' libraries are optional extras: one asked for
and not installed is a ConfigError from `check_trackers`, before any work.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from app.core.redact import mask_url_passwords
from app.components.tracking.base import Sink
from app.components.tracking.local import default_sinks
from app.config.validation import ConfigError, first_line

# setting -> (module to import, pip extra)
TRACKERS = {"wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow")}


def installed(module: str) -> bool:
    if module in sys.modules:  # None there means "import refused"
        return sys.modules[module] is not None
    return importlib.util.find_spec(module) is not None


def check_trackers(cfg: DictConfig) -> None:
    """A tracker asked for whose library is missing: one line naming the setting and the extra."""
    tracking = cfg.get("tracking")
    for key, (module, extra) in TRACKERS.items():
        if tracking is not None and tracking[key].enabled and not installed(module):
            raise ConfigError(
                f"tracking.{key}.enabled=true needs the {module} package, which is not installed; "
                f'pip install "hydratrain[{extra}]" (in a checkout: pip install -e ".[{extra}]"), '
                f"or tracking.{key}.enabled=false"
            )
    if tracking is not None and tracking.mlflow.enabled and tracking.mlflow.artifact_location:
        from app.components.tracking.mlflow_sink import check_artifact_location

        location = str(tracking.mlflow.artifact_location)
        if (why := check_artifact_location(location)) is not None:
            raise ConfigError(f"tracking.mlflow.artifact_location={location!r}: {why}")


def build_sinks(cfg: DictConfig, run_dir: Path) -> list[Sink]:
    """TensorBoard and metrics.jsonl, then each tracker enabled. A tracker that cannot start (a
    tracking URI MLflow refuses, W&B online without a login) is a ConfigError naming it."""
    sinks = default_sinks(run_dir)
    tracking = cfg.get("tracking")
    name = "/".join(run_dir.parts[-2:])
    for key, start in (("wandb", _wandb), ("mlflow", _mlflow)):
        if tracking is None or not tracking[key].enabled:
            continue
        try:
            sinks.append(start(cfg, run_dir, name))
        except Exception as exc:
            for sink in sinks:
                sink.close(None)
            raise ConfigError(f"tracking.{key}: could not start: {first_line(exc)}") from exc
    return sinks


def _wandb(cfg: DictConfig, run_dir: Path, name: str) -> Sink:
    from app.components.tracking.wandb_sink import WandbSink

    return WandbSink(cfg.tracking.wandb, run_dir, name, study_name(cfg))


def _mlflow(cfg: DictConfig, run_dir: Path, name: str) -> Sink:
    from app.components.tracking.mlflow_sink import MlflowSink

    return MlflowSink(cfg.tracking.mlflow, name, {"run_dir": str(run_dir)})


def study_name(cfg: DictConfig) -> str | None:
    hpo = cfg.get("hpo")
    return str(hpo.study_name) if hpo is not None and hpo.get("study_name") else None


def tracked_config(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as trackers store it, with any URL password masked."""
    try:
        plain = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    except Exception:  # an interpolation only Hydra's job can resolve: keep it as written
        plain = OmegaConf.to_container(cfg, resolve=False)
    return _masked(plain)


def _masked(node: Any) -> Any:
    if isinstance(node, dict):
        return {str(k): _masked(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_masked(v) for v in node]
    if isinstance(node, str):
        return mask_url_passwords(node)  # hpo.storage may hold one
    return node
