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
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from app.components.tracking.base import Sink
from app.core.redact import mask_url_passwords
from app.core.registry import Registry

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


class TrackerSettings(Protocol):
    """What every tracker's node under `tracking` has (each adds its own typed fields)."""

    enabled: bool

    def check(self) -> None: ...


S = TypeVar("S", bound=TrackerSettings)


@dataclass(frozen=True)
class Tracker(Generic[S]):
    """A tracker: its settings' class (the node tracking.<name>) and what it does with them."""

    name: str  # its node: tracking.<name>
    module: str  # the library it needs
    extra: str  # the pip extra that installs that library
    settings: type[S]
    start: Callable[[S, Path, str, str | None], Sink]  # (its settings, run dir, name, study)
    check: Callable[[S], None] | None = None  # what its library can refuse before a run

    def settings_in(self, tracking: object) -> S:
        """Its own typed settings, from the `tracking` node."""
        node = getattr(tracking, self.name)
        if not isinstance(node, self.settings):
            raise TypeError(f"tracking.{self.name} is {type(node).__name__}, not {self.settings}")
        return node

    def enabled_in(self, tracking: object) -> bool:
        return bool(self.settings_in(tracking).enabled)

    def check_in(self, tracking: object) -> None:
        if self.check is not None:
            self.check(self.settings_in(tracking))

    def start_in(self, tracking: object, run_dir: Path, name: str, study: str | None) -> Sink:
        return self.start(self.settings_in(tracking), run_dir, name, study)


class TrackerKind(Protocol):
    """A tracker as the run sees it, whatever its settings' type: each finds its own node."""

    @property
    def name(self) -> str: ...

    @property
    def module(self) -> str: ...

    @property
    def extra(self) -> str: ...

    def enabled_in(self, tracking: object) -> bool: ...

    def check_in(self, tracking: object) -> None: ...

    def start_in(self, tracking: object, run_dir: Path, name: str, study: str | None) -> Sink: ...


TRACKERS: Registry[TrackerKind] = Registry(__name__, "tracking")


def tracked_config(config: DataclassInstance) -> dict[str, object]:
    """The resolved config (a typed config) as trackers store it, URL passwords masked."""
    return {str(k): _masked(v) for k, v in dataclasses.asdict(config).items()}


def _masked(node: object) -> object:
    if isinstance(node, dict):
        return {str(k): _masked(v) for k, v in node.items()}
    if isinstance(node, list | tuple):
        return [_masked(v) for v in node]
    if isinstance(node, str):
        return mask_url_passwords(node)  # hpo.storage may hold one
    return node
