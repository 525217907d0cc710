"""MLflow through its client API (`pip install -e ".[mlflow]"`).

MlflowClient rather than the fluent `mlflow.start_run()`: no process-wide active run, so trials
that share a process each get their own run and nothing leaks from one to the next. The default
tracking URI is a SQLite database under outputs/ (MLflow's own recommended local store; its file
store is in maintenance mode and refused by MLflow 3 unless MLFLOW_ALLOW_FILE_STORE=true).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from app.components.tracking import TRACKERS, Tracker
from app.components.tracking.base import COMPLETED, STOPPED, Sink
from app.core.errors import ConfigError, first_line

# A tracking server that is down must not stall training: MLflow's own defaults (7 retries,
# backoff factor 2, 120 s timeouts) wait minutes per call, SIGTERM included. A user's own
# MLFLOW_HTTP_REQUEST_* variables win.
HTTP_LIMITS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}
# Artifact schemes served through the tracking server: checked by the server, not here.
_SERVER_SCHEMES = {"mlflow-artifacts", "http", "https"}
PARAMS_PER_BATCH = 100  # MLflow's log_batch limit
PARAM_VALUE_CHARS = 500  # the smallest limit across MLflow versions (6000 since 2.x)
_NOT_IN_A_KEY = re.compile(r"[^\w./ -]")  # MLflow keys: alphanumerics, _ - . / and spaces


@dataclass
class MlflowConfig:
    """MLflow (pip extra `mlflow`). A local SQLite database by default, any tracking URI by
    config. MLflow 3 refuses a bare file store unless MLFLOW_ALLOW_FILE_STORE=true."""

    enabled: bool = False
    tracking_uri: str = "sqlite:///outputs/mlflow/mlflow.db"  # relative paths: the working dir
    experiment: str = "hydratrain"
    run_name: str | None = None  # null: the run dir's last two parts
    # Where a new experiment keeps its artifacts; null: beside a SQLite database, else the
    # server's default.
    artifact_location: str | None = None
    tags: dict[str, str] = field(default_factory=dict)

    def check(self) -> None:
        for key, value in (("experiment", self.experiment), ("tracking_uri", self.tracking_uri)):
            if not str(value).strip():
                raise ConfigError(f"tracking.mlflow.{key}={value!r} must not be empty")


class MlflowSink(Sink):
    name = "mlflow"

    def __init__(self, cfg: MlflowConfig, run_name: str, tags: dict[str, str]) -> None:
        from mlflow.tracking import MlflowClient

        for name, value in HTTP_LIMITS.items():
            os.environ.setdefault(name, value)
        uri = resolve_tracking_uri(cfg.tracking_uri)
        self._client = MlflowClient(tracking_uri=uri)
        experiment = self._experiment_id(cfg.experiment, artifact_location(cfg, uri))
        run_tags = {**tags, **dict(cfg.tags)}
        run = self._client.create_run(experiment, run_name=cfg.run_name or run_name, tags=run_tags)
        self.run_id = run.info.run_id
        self.tracking_uri = uri

    def _experiment_id(self, name: str, location: str | None) -> str:
        found = self._client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self._client.create_experiment(name, artifact_location=location)
        except Exception:  # another worker of the sweep created it first
            found = self._client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def scalars(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, step) for key, value in values.items()]
        self._client.log_batch(self.run_id, metrics=metrics)

    def text(self, tag: str, text: str) -> None:
        self._client.log_text(self.run_id, text, f"{tag}.txt")

    def config(self, config: Mapping[str, object], plan: Mapping[str, object]) -> None:
        from mlflow.entities import Param

        self._client.log_dict(self.run_id, dict(config), "config.json")
        flat = {**flatten(config), **flatten({"batch_plan": plan})}
        params = [Param(k, str(v)[:PARAM_VALUE_CHARS]) for k, v in flat.items()]
        for i in range(0, len(params), PARAMS_PER_BATCH):
            self._client.log_batch(self.run_id, params=params[i : i + PARAMS_PER_BATCH])

    def close(self, summary: Mapping[str, object] | None) -> None:
        status = (summary or {}).get("status")
        if summary:
            self._client.log_dict(self.run_id, dict(summary), "summary.json")
            self._client.set_tag(self.run_id, "status", str(status))
        state = "FINISHED" if status == COMPLETED else "KILLED" if status in STOPPED else "FAILED"
        self._client.set_terminated(self.run_id, status=state)


def resolve_tracking_uri(uri: str) -> str:
    """sqlite:/// with a relative path is made absolute (and its directory created), so the run
    and `mlflow ui` agree on where it is; any other URI goes to MLflow as written."""
    if uri.startswith("sqlite:///"):
        path = Path(uri.removeprefix("sqlite:///")).expanduser().absolute()
        path.parent.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{path}"
    return uri


def artifact_location(cfg: MlflowConfig, uri: str) -> str | None:
    """Artifacts of a SQLite store live beside the database, not in ./mlruns of whatever
    directory the run was started from (MLflow's default for database stores)."""
    if cfg.artifact_location:
        return str(cfg.artifact_location)
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).parent / "artifacts").as_uri()
    return None


def check_artifact_location(location: str) -> str | None:
    """Why MLflow cannot store artifacts at `location` (no repository for its scheme, or its
    library missing), or None. Checked before the experiment is created: MLflow keeps an
    experiment's artifact location for good."""
    from urllib.parse import urlparse

    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    if urlparse(location).scheme in _SERVER_SCHEMES:
        return None
    try:
        get_artifact_repository(location)
    except Exception as exc:  # MlflowException (unknown scheme), ImportError (its client)
        return first_line(exc)
    return None


def flatten(node: object, prefix: str = "") -> dict[str, object]:
    """{"training": {"lr": 1e-3}} -> {"training.lr": 1e-3}: one MLflow param per setting."""
    if isinstance(node, Mapping):
        out: dict[str, object] = {}
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {_NOT_IN_A_KEY.sub("_", prefix.rstrip(".")): node}


def _check(cfg: MlflowConfig) -> None:
    """An artifact location MLflow cannot store to, refused before the experiment exists."""
    if cfg.artifact_location:
        location = str(cfg.artifact_location)
        if (why := check_artifact_location(location)) is not None:
            raise ConfigError(f"tracking.mlflow.artifact_location={location!r}: {why}")


def _start(cfg: MlflowConfig, run_dir: Path, run_name: str, study: str | None) -> Sink:
    return MlflowSink(cfg, run_name, {"run_dir": str(run_dir)})


TRACKERS.add(Tracker("mlflow", "mlflow", "mlflow", MlflowConfig, start=_start, check=_check))
