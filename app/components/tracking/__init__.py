"""Where a run's records go: TensorBoard and metrics.jsonl always, trackers when asked.

A tracker (W&B, MLflow) is a module of this package that registers a `Tracker` and declares its
config node under `tracking` (app/components/tracking/config.py). `build_sinks` (sinks.py) turns
the `tracking` config into sinks (base.py) that RunLogger fans out to, on the main rank only.
The trackers' libraries are optional extras: one asked for and not installed is a ConfigError
from `check_trackers`, before any work.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.components.tracking.base import Sink
from app.core.redact import mask_url_passwords
from app.core.registry import Registry

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


@dataclass(frozen=True)
class Tracker:
    name: str  # its node: tracking.<name>
    module: str  # the library it needs
    extra: str  # the pip extra that installs that library
    start: Callable[[Any, Path, str, str | None], Sink]  # (its config, run dir, name, study)
    check: Callable[[Any], None] | None = None  # what its library can refuse before a run


TRACKERS: Registry[Tracker] = Registry(__name__, "tracking")


def tracked_config(config: DataclassInstance) -> dict[str, Any]:
    """The resolved config (a typed config) as trackers store it, URL passwords masked."""
    masked: dict[str, Any] = _masked(dataclasses.asdict(config))
    return masked


def _masked(node: Any) -> Any:
    if isinstance(node, dict):
        return {str(k): _masked(v) for k, v in node.items()}
    if isinstance(node, list | tuple):
        return [_masked(v) for v in node]
    if isinstance(node, str):
        return mask_url_passwords(node)  # hpo.storage may hold one
    return node
