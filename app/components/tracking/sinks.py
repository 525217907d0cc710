"""The trackers a run's `tracking` config asks for: checked before any work, started as sinks."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from app.components.tracking import TRACKERS, TrackerKind
from app.components.tracking.base import Sink
from app.components.tracking.config import TrackingConfig
from app.core.errors import ConfigError, first_line


def installed(module: str) -> bool:
    if module in sys.modules:  # None there means "import refused"
        return sys.modules[module] is not None
    return importlib.util.find_spec(module) is not None


def enabled(tracking: TrackingConfig) -> list[TrackerKind]:
    """The trackers asked for."""
    return [t for t in TRACKERS.all() if t.enabled_in(tracking)]


def check_trackers(tracking: TrackingConfig) -> None:
    """A tracker asked for whose library is missing: one line naming the setting and the extra."""
    for tracker in enabled(tracking):
        if not installed(tracker.module):
            key, module, extra = tracker.name, tracker.module, tracker.extra
            raise ConfigError(
                f"tracking.{key}.enabled=true needs the {module} package, which is not installed; "
                f'pip install "hydratrain[{extra}]" (in a checkout: pip install -e ".[{extra}]"), '
                f"or tracking.{key}.enabled=false"
            )
        tracker.check_in(tracking)


def build_sinks(tracking: TrackingConfig, run_dir: Path, study: str | None) -> list[Sink]:
    """TensorBoard and metrics.jsonl, then each tracker enabled. A tracker that cannot start (a
    tracking URI MLflow refuses, W&B online without a login) is a ConfigError naming it."""
    from app.components.tracking.local import default_sinks

    sinks = default_sinks(run_dir)
    name = "/".join(run_dir.parts[-2:])
    for tracker in enabled(tracking):
        try:
            sinks.append(tracker.start_in(tracking, run_dir, name, study))
        except Exception as exc:
            for sink in sinks:
                sink.close(None)
            raise ConfigError(
                f"tracking.{tracker.name}: could not start: {first_line(exc)}"
            ) from exc
    return sinks
