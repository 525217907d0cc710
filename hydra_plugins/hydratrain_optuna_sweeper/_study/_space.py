"""Search space: Hydra override expressions -> Optuna distributions, via Hydra's own parser.

Semantics follow the stock hydra-optuna-sweeper so its configs mean the same here:
choice(...) -> categorical (lists and dicts become their override text, as stock);
range(a, b, step) -> int/float steps with b *inclusive*; interval(a, b) -> uniform (int when
both ends are ints); tag(log, interval(...)) -> log scale; a plain value is fixed: passed to
every job and recorded as a user attribute; `~key` is passed to every job (and drops `key`
from the space). Our addition: a key whose value is null is dropped from the space.

The stock sweeper's legacy `search_space` node ({key: {type, low, high, step, log, choices}})
becomes the distributions its last release builds from it (`legacy_entries`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeAlias, TypeGuard, cast

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
from omegaconf import DictConfig
from optuna.distributions import (
    BaseDistribution,
    CategoricalChoiceType,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import Trial

from .._errors import SweepConfigError, first_line

Value: TypeAlias = CategoricalChoiceType  # a sampled value: None, bool, int, float or str
Grid: TypeAlias = dict[str, list[Value]]  # the values GridSampler visits, per key


@dataclass(frozen=True)
class Entry:
    """One `key=expression` and the setting it came from (named in error lines)."""

    source: str  # hydra.sweeper.params.KEY, hpo.params.KEY, or KEY (the command line)
    text: str
    drop: bool = False  # a null value: `text` is the key alone, and it is not searched
    dist: BaseDistribution | None = None  # given, not parsed (hydra.sweeper.search_space)

    @classmethod
    def argument(cls, text: str) -> Entry:
        return cls(text.partition("=")[0].lstrip("~+"), text)

    @property
    def shown(self) -> str:
        """`setting=expression`, as an error line names it."""
        return f"{self.source}={self.text.partition('=')[2]}"


@dataclass
class SearchSpace:
    distributions: dict[str, BaseDistribution] = field(default_factory=dict)
    # categorical value -> its override text (a list choice is sampled as its text, as stock)
    choice_texts: dict[str, dict[Value, str]] = field(default_factory=dict)
    fixed: dict[str, str] = field(default_factory=dict)  # key -> value text
    deletions: list[str] = field(default_factory=list)  # ~key overrides, passed to every job
    shown: dict[str, str] = field(default_factory=dict)  # key -> setting=expression

    def override(self, key: str, value: Value) -> str:
        """`key=value` as Hydra parses it back to `value`."""
        text = self.choice_texts.get(key, {}).get(value)
        return f"{key}={format_value(value) if text is None else text}"

    def fixed_overrides(self, exclude: Mapping[str, object]) -> list[str]:
        return [f"{k}={v}" for k, v in self.fixed.items() if k not in exclude]

    def draw(self, trial: Trial) -> None:
        """Sample `trial`'s point, as the worker will (a second call returns the same)."""
        for name, dist in self.distributions.items():
            suggest(trial, name, dist)

    def grid(self) -> Grid:
        """The values GridSampler visits, as the stock sweeper builds them (its range ends
        *before* the upper end, unlike the other samplers)."""
        return {k: _grid_values(self.shown[k], d) for k, d in self.distributions.items()}


def params_entries(params: Mapping[str, object] | None, prefix: str) -> list[Entry]:
    """A params mapping (hydra.sweeper.params or hpo.params) as entries; null drops a key."""
    return [
        Entry(f"{prefix}.{k}", str(k), drop=True)
        if v is None
        else Entry(f"{prefix}.{k}", f"{k}={v}")
        for k, v in (params or {}).items()
    ]


def parse_space(entries: list[Entry]) -> SearchSpace:
    """Entries in order (config, then command line): a later entry for a key replaces an
    earlier one, keeping its place."""
    parser = OverridesParser.create()
    space = SearchSpace()
    for entry in entries:
        if entry.drop:
            _drop(space, entry.text)
            continue
        if entry.dist is not None:
            _search(space, entry, entry.text.partition("=")[0], entry.dist, {})
            continue
        override = _parse_one(parser, entry)
        key = override.get_key_element()
        if override.is_delete():
            _drop(space, key.lstrip("~"))
            space.deletions.append(entry.text)
        elif override.is_sweep_override():
            _search(space, entry, key, *_distribution(entry.shown, override))
        else:
            space.distributions.pop(key, None)
            space.fixed[key] = override.get_value_element_as_str()
    return space


def _search(
    space: SearchSpace, entry: Entry, key: str, dist: BaseDistribution, texts: dict[Value, str]
) -> None:
    space.fixed.pop(key, None)
    space.distributions[key] = dist
    space.choice_texts[key] = texts
    space.shown[key] = entry.shown


def _drop(space: SearchSpace, key: str) -> None:
    space.distributions.pop(key, None)
    space.choice_texts.pop(key, None)
    space.fixed.pop(key, None)


def _parse_one(parser: OverridesParser, entry: Entry) -> Override:
    try:
        return parser.parse_overrides([entry.text])[0]
    except HydraException as e:
        raise SweepConfigError(f"{entry.shown}: cannot parse: {first_line(e)}") from None


def _distribution(shown: str, override: Override) -> tuple[BaseDistribution, dict[Value, str]]:
    value = override.value()
    try:
        if isinstance(value, ChoiceSweep) or (isinstance(value, RangeSweep) and value.shuffle):
            return _categorical(override)
        if isinstance(value, RangeSweep):
            return _range(value), {}
        if isinstance(value, IntervalSweep):
            return _interval(value), {}
    except (ValueError, TypeError) as e:
        raise SweepConfigError(f"{shown}: {e}") from None
    raise SweepConfigError(f"{shown}: {type(value).__name__} is not supported by this sweeper")


def _categorical(override: Override) -> tuple[CategoricalDistribution, dict[Value, str]]:
    values = list(override.sweep_iterator(transformer=Transformer.identity))
    # stock: lists and dicts are sampled as their text
    sampled = [cast(CategoricalChoiceType, Transformer.encode(v)) for v in values]
    texts = {s: Transformer.str(v) for s, v in zip(sampled, values, strict=True)}
    return CategoricalDistribution(sampled), texts


def _range(value: RangeSweep) -> BaseDistribution:
    start, stop, step = value.start, value.stop, value.step
    if start is None or stop is None:
        raise ValueError("a range needs a start and a stop")
    if any(isinstance(x, float) for x in (start, stop, step)):
        return FloatDistribution(float(start), float(stop), step=float(step))
    return IntDistribution(int(start), int(stop), step=int(step))


def _interval(value: IntervalSweep) -> BaseDistribution:
    log = "log" in value.tags
    start, end = value.start, value.end
    if start is None or end is None:
        raise ValueError("an interval needs both ends")
    if isinstance(start, int) and isinstance(end, int):
        return IntDistribution(start, end, log=log)
    return FloatDistribution(float(start), float(end), log=log)


def _grid_values(shown: str, dist: BaseDistribution) -> list[Value]:
    if isinstance(dist, CategoricalDistribution):
        return list(dist.choices)
    step = getattr(dist, "step", None)
    if isinstance(dist, IntDistribution | FloatDistribution) and step and not dist.log:
        n = int((dist.high - dist.low) // step)
        return [dist.low + i * step for i in range(n)]
    raise SweepConfigError(
        f"{shown}: the grid sampler needs discrete values (choice or range); "
        f"this is a continuous interval"
    )


LEGACY_TYPES = ("int", "float", "categorical")
LEGACY_FIELDS = ("type", "choices", "low", "high", "log", "step")
_TYPES = ", ".join(LEGACY_TYPES)


def legacy_entries(search_space: Mapping[str, object], prefix: str) -> list[Entry]:
    """hydra.sweeper.search_space: {key: {type, ...}} as entries with their distributions."""
    return [
        Entry(f"{prefix}.{k}", f"{k}={v}", dist=legacy_distribution(f"{prefix}.{k}", v))
        for k, v in search_space.items()
    ]


def legacy_distribution(setting: str, node: object) -> BaseDistribution:
    """The distribution the stock sweeper's last release builds from one DistributionConfig
    (its create_optuna_distribution_from_config, in Optuna 4 terms): with log, step is ignored;
    int casts low, high and step to int. What it would stop on with a traceback is one line."""
    if not isinstance(node, Mapping):
        raise SweepConfigError(f"{setting}={node!r} must be a mapping with a type: {_TYPES}")
    unknown = sorted(set(node) - set(LEGACY_FIELDS))
    if unknown:
        known = ", ".join(LEGACY_FIELDS)
        raise SweepConfigError(f"{setting}.{unknown[0]}: no such field; known: {known}")
    kind = node.get("type")
    if kind not in LEGACY_TYPES:
        raise SweepConfigError(f"{setting}.type={kind!r} is not allowed; choose one of: {_TYPES}")
    try:
        return _legacy(setting, kind, node)
    except (TypeError, ValueError) as e:  # Optuna's own checks: low <= high, step > 0, ...
        raise SweepConfigError(f"{setting}={dict(node)}: {first_line(e)}") from None


def _legacy(setting: str, kind: str, node: Mapping[str, object]) -> BaseDistribution:
    if kind == "categorical":
        choices = node.get("choices")
        if not isinstance(choices, list | tuple) or not choices:
            raise SweepConfigError(f"{setting}.choices must list the values of a categorical")
        return CategoricalDistribution(list(choices))
    low, high, step, log = (node.get(k) for k in ("low", "high", "step", "log"))
    if low is None or high is None:
        raise SweepConfigError(f"{setting}: a {kind} needs low and high")
    low, high = _number(low), _number(high)
    if kind == "int":
        if log:
            return IntDistribution(int(low), int(high), log=True)
        return IntDistribution(int(low), int(high), step=1 if step is None else int(_number(step)))
    if log:
        return FloatDistribution(low, high, log=True)
    return FloatDistribution(low, high, step=None if step is None else _number(step))


def _number(value: object) -> int | float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    raise TypeError(f"{value!r} is not a number")


def suggest(trial: Trial, name: str, dist: BaseDistribution) -> Value:
    """Sample through the public suggest_* API (stable across Optuna 4 and 5)."""
    if isinstance(dist, CategoricalDistribution):
        return trial.suggest_categorical(name, list(dist.choices))
    if isinstance(dist, IntDistribution):
        step = None if dist.log else dist.step
        return trial.suggest_int(name, dist.low, dist.high, step=step or 1, log=dist.log)
    if isinstance(dist, FloatDistribution):
        return trial.suggest_float(name, dist.low, dist.high, step=dist.step, log=dist.log)
    raise TypeError(f"unsupported distribution {dist!r}")


def ends(dist: BaseDistribution) -> list[Value]:
    """The values a search-space check tries: every choice, or both ends."""
    if isinstance(dist, CategoricalDistribution):
        return list(dist.choices)
    if isinstance(dist, IntDistribution | FloatDistribution):
        return [dist.low, dist.high]
    raise TypeError(f"unsupported distribution {dist!r}")


def largest_point(distributions: Mapping[str, BaseDistribution]) -> dict[str, Value]:
    """Each numeric parameter at its largest value: the sizes that set a trial's memory (batch,
    sequence, layers) grow with their value, so this point bounds the space's peak memory.
    A choice among words (an architecture's name) is left to the sampler."""
    point: dict[str, Value] = {}
    for name, dist in distributions.items():
        if isinstance(dist, IntDistribution | FloatDistribution):
            point[name] = dist.high
        elif isinstance(dist, CategoricalDistribution):
            numbers = [c for c in dist.choices if _is_number(c)]
            if numbers and len(numbers) == len(dist.choices):
                point[name] = max(numbers)
    return point


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


# fn(the sweep's config, trial) -> {key: value} to set, or None
SpaceHook: TypeAlias = Callable[[DictConfig, Trial], Mapping[str, object] | None]


def load_hook(path: str | None, key: str) -> SpaceHook | None:
    """The conditional-space hook: `fn(cfg, trial) -> {key: value} | None` by dotted path."""
    if not path:
        return None
    try:
        return get_method(path)
    except Exception as e:
        raise SweepConfigError(f"{key}={path!r} cannot be imported: {first_line(e)}") from None


def format_value(value: object) -> str:
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
