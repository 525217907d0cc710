"""Where a run's records go: TensorBoard and metrics.jsonl always, trackers when asked.

A tracker (W&B, MLflow) is a module of this package that registers a `Tracker` and declares its
config node under `tracking` (app/components/tracking/config.py). `build_sinks` turns the
`tracking` config into sinks (app/components/tracking/base.py) that RunLogger fans out to, on the
main rank only. The trackers' libraries are optional extras: one asked for and not installed is
a ConfigError from `check_trackers`, before any work.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.components.tracking.base import Sink
from app.core.errors import ConfigError, first_line
from app.core.redact import mask_url_passwords
from app.core.registry import Registry

if TYPE_CHECKING:
    from app.components.tracking.config import TrackingConfig


@dataclass(frozen=True)
class Tracker:
    name: str  # its node: tracking.<name>
    module: str  # the library it needs
    extra: str  # the pip extra that installs that library
    start: Callable[[Any, Path, str, str | None], Sink]  # (its config, run dir, name, study)
    check: Callable[[Any], None] | None = None  # what its library can refuse before a run


TRACKERS: Registry[Tracker] = Registry(__name__, "tracking")


def installed(module: str) -> bool:
    if module in sys.modules:  # None there means "import refused"
        return sys.modules[module] is not None
    return importlib.util.find_spec(module) is not None


def enabled(tracking: TrackingConfig) -> list[tuple[Tracker, Any]]:
    """The trackers asked for, each with its config node."""
    nodes = [(t, getattr(tracking, t.name)) for t in TRACKERS.all()]
    return [(t, node) for t, node in nodes if node.enabled]


def check_trackers(tracking: TrackingConfig) -> None:
    """A tracker asked for whose library is missing: one line naming the setting and the extra."""
    for tracker, node in enabled(tracking):
        if not installed(tracker.module):
            key, module, extra = tracker.name, tracker.module, tracker.extra
            raise ConfigError(
                f"tracking.{key}.enabled=true needs the {module} package, which is not installed; "
                f'pip install "hydratrain[{extra}]" (in a checkout: pip install -e ".[{extra}]"), '
                f"or tracking.{key}.enabled=false"
            )
        if tracker.check is not None:
            tracker.check(node)


def build_sinks(tracking: TrackingConfig, run_dir: Path, study: str | None) -> list[Sink]:
    """TensorBoard and metrics.jsonl, then each tracker enabled. A tracker that cannot start (a
    tracking URI MLflow refuses, W&B online without a login) is a ConfigError naming it."""
    from app.components.tracking.local import default_sinks

    sinks = default_sinks(run_dir)
    name = "/".join(run_dir.parts[-2:])
    for tracker, node in enabled(tracking):
        try:
            sinks.append(tracker.start(node, run_dir, name, study))
        except Exception as exc:
            for sink in sinks:
                sink.close(None)
            raise ConfigError(
                f"tracking.{tracker.name}: could not start: {first_line(exc)}"
            ) from exc
    return sinks


def tracked_config(config: Any) -> dict[str, Any]:
    """The resolved config as trackers store it, with any URL password masked."""
    plain = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
    return _masked(plain)


def _masked(node: Any) -> Any:
    if isinstance(node, dict):
        return {str(k): _masked(v) for k, v in node.items()}
    if isinstance(node, list | tuple):
        return [_masked(v) for v in node]
    if isinstance(node, str):
        return mask_url_passwords(node)  # hpo.storage may hold one
    return node
