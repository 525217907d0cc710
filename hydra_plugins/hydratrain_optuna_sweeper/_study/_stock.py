"""The stock sweeper's surface: `hydra.sweeper.*` as composed (`StockOptions`), each key by its
row of `config.STOCK_KEYS`, and the legacy `hydra.sweeper.search_space` read as the stock
sweeper's last release reads it. `_settings.read_settings` turns these into the sweep's
settings; nothing past it asks which node a setting came from."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

from hydra.errors import HydraDeprecationError
from omegaconf import OmegaConf

from .. import _private as private
from .._errors import SweepConfigError, first_line
from ..config import STOCK_KEYS

# The stock sweeper's words, as its last release (1.3.0) says them about its legacy node.
SEARCH_SPACE_URL = "https://hydra.cc/docs/upgrades/1.1_to_1.2/changes_to_sweeper_config/"
SEARCH_SPACE_DEPRECATED = (
    "`hydra.sweeper.search_space` is deprecated and will be removed in the next major release.\n"
    f"Please configure with `hydra.sweeper.params`.\n{SEARCH_SPACE_URL}\n"
)
SEARCH_SPACE_IGNORED = (
    "Both hydra.sweeper.params and hydra.sweeper.search_space are configured."
    f"\nHydra will use hydra.sweeper.params for defining search space.\n{SEARCH_SPACE_URL}"
)
_ROWS = {k.name: k for k in STOCK_KEYS}


@dataclass(frozen=True)
class StockOptions:
    """`hydra.sweeper.*` as composed, by the names of `config.STOCK_KEYS`: only the keys that
    are set. An unset one leaves its `hpo.*` setting in charge, except that the stock node's
    null `storage` and `study_name` mean "in memory" and "a fresh study", as they do there."""

    stock_node: bool
    values: Mapping[str, object] = field(default_factory=dict)

    @classmethod
    def of(cls, options: Mapping[str, object], stock_node: bool) -> StockOptions:
        unknown = sorted(set(options) - set(_ROWS))
        if unknown:
            raise SweepConfigError(
                f"hydra.sweeper.{unknown[0]}: no such setting; known keys: {', '.join(_ROWS)}"
            )
        return cls(stock_node, {k: v for k, v in options.items() if v is not None})

    def get(self, name: str) -> object:
        """hydra.sweeper.`name` when set, else None; `name` is a row of the table."""
        return self.values.get(_ROWS[name].name)

    def pick(self, name: str, ours: object) -> tuple[object, str]:
        """(value, the setting it came from): the stock key when set, else the hpo.* setting
        the table maps it onto, whose value is `ours`."""
        value = self.get(name)
        if value is not None:
            return value, f"hydra.sweeper.{name}"
        return ours, f"{_ROWS[name].setting}"


def legacy_search_space(stock: StockOptions) -> Mapping[str, object] | None:
    """hydra.sweeper.search_space as the stock sweeper's last release reads it: beside
    hydra.sweeper.params it is ignored, with a warning; alone it is the search space (in the
    place of hpo.params too), with Hydra's deprecation warning."""
    legacy = stock.get("search_space")
    if legacy is None:
        return None
    if stock.get("params") is not None:
        warnings.warn(SEARCH_SPACE_IGNORED, UserWarning, stacklevel=2)
        return None
    try:
        private.hydra_deprecation_warning(SEARCH_SPACE_DEPRECATED)
    except HydraDeprecationError as e:  # HYDRA_DEPRECATION_WARNINGS_AS_ERRORS is set
        raise SweepConfigError(f"hydra.sweeper.search_space: {first_line(e)}") from None
    space = plain(legacy)
    if not isinstance(space, Mapping):
        raise SweepConfigError(
            f"hydra.sweeper.search_space={space!r} must be a mapping of key: "
            "{type: int|float|categorical, ...}"
        )
    return {str(k): v for k, v in space.items()}


def plain(node: object) -> object:
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
