"""Search space: Hydra override expressions -> Optuna distributions, via Hydra's own parser.

Semantics follow the stock hydra-optuna-sweeper so its configs behave the same here:
choice(...) -> categorical; range(a, b, step) -> int/float grid with b *inclusive*;
interval(a, b) -> uniform (int when both ends are ints); tag(log, interval(...)) -> log scale;
any non-sweep value is passed to every trial unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import (
    ChoiceSweep,
    IntervalSweep,
    Override,
    RangeSweep,
    Transformer,
)
from hydra.errors import HydraException
from hydra.utils import get_method
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import Trial

from ._settings import SweepConfigError


def parse_space(
    entries: list[tuple[str, str]],
) -> tuple[dict[str, BaseDistribution], dict[str, str]]:
    """(source, 'key=value') pairs -> (distributions, fixed overrides); later entries win."""
    parser = OverridesParser.create()
    space: dict[str, BaseDistribution] = {}
    fixed: dict[str, str] = {}
    for source, text in entries:
        override = _parse_one(parser, source, text)
        key = override.get_key_element()
        space.pop(key, None)
        fixed.pop(key, None)
        if override.is_sweep_override():
            space[key] = _distribution(source, override)
        else:
            fixed[key] = text
    return space, fixed


def _parse_one(parser: OverridesParser, source: str, text: str) -> Override:
    try:
        return parser.parse_overrides([text])[0]
    except HydraException as e:
        first = str(e).strip().splitlines()[0]
        raise SweepConfigError(f"{source}: cannot parse {text!r}: {first}") from None


def _distribution(source: str, override: Override) -> BaseDistribution:
    value = override.value()
    try:
        if isinstance(value, ChoiceSweep) or (isinstance(value, RangeSweep) and value.shuffle):
            return CategoricalDistribution(_choices(override))
        if isinstance(value, RangeSweep):
            return _range(value)
        if isinstance(value, IntervalSweep):
            return _interval(value)
    except (ValueError, TypeError) as e:
        raise SweepConfigError(f"{source}: {e}") from None
    raise SweepConfigError(f"{source}: {type(value).__name__} is not supported by this sweeper")


def _choices(override: Override) -> list[Any]:
    choices = list(override.sweep_iterator(transformer=Transformer.identity))
    for c in choices:
        if not isinstance(c, str | int | float | bool | type(None)):
            raise TypeError(f"choice() takes str, int, float, bool or null values, got {c!r}")
    return choices


def _range(value: RangeSweep) -> BaseDistribution:
    ends = (value.start, value.stop, value.step)
    if any(isinstance(x, float) for x in ends):
        return FloatDistribution(float(value.start), float(value.stop), step=float(value.step))
    return IntDistribution(int(value.start), int(value.stop), step=int(value.step))


def _interval(value: IntervalSweep) -> BaseDistribution:
    log = "log" in value.tags
    if isinstance(value.start, int) and isinstance(value.end, int):
        return IntDistribution(value.start, value.end, log=log)
    return FloatDistribution(float(value.start), float(value.end), log=log)


def suggest(trial: Trial, name: str, dist: BaseDistribution) -> Any:
    """Sample through the public suggest_* API (stable across Optuna 4 and 5)."""
    if isinstance(dist, CategoricalDistribution):
        return trial.suggest_categorical(name, list(dist.choices))
    if isinstance(dist, IntDistribution):
        step = None if dist.log else dist.step
        return trial.suggest_int(name, dist.low, dist.high, step=step or 1, log=dist.log)
    if isinstance(dist, FloatDistribution):
        return trial.suggest_float(name, dist.low, dist.high, step=dist.step, log=dist.log)
    raise TypeError(f"unsupported distribution {dist!r}")


SpaceHook = Callable[[Any, Trial], Mapping[str, Any] | None]


def load_hook(path: str | None) -> SpaceHook | None:
    """The conditional-space hook: `fn(cfg, trial) -> {key: value} | None` by dotted path."""
    if not path:
        return None
    try:
        return get_method(path)
    except Exception as e:
        raise SweepConfigError(f"hpo.search_space_fn={path!r} cannot be imported: {e}") from None


def format_value(value: Any) -> str:
    """A Python value as an override value Hydra parses back to the same value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value)
    if text.isidentifier() and text.lower() not in ("null", "true", "false", "inf", "nan"):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
