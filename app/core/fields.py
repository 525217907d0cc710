"""Settings that carry their allowed values: a field's range or choices are declared with it.

A config dataclass declares each numeric setting with its range (`bounded`, `positive_int`,
`count`, `fraction`) and each named setting with what it may be (`one_of`); `check_fields`
walks a config and refuses the first value its field does not allow, with one line naming the
setting, the value and what is allowed. A NaN, an infinity or an absurd value is refused the
same way wherever it comes from (command line, experiment file, sweep).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict, TypeGuard, TypeVar

from app.core.errors import ConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance
    from typing_extensions import Unpack  # typing's own from Python 3.11

INF = math.inf
_BOUND = "bound"
_CHOICES = "choices"
T = TypeVar("T")  # a field's default: the field helpers return it as dataclasses.field does


@dataclass(frozen=True)
class Bound:
    """A numeric setting's allowed range; `integer` also refuses floats and booleans."""

    low: float = -INF
    high: float = INF
    low_open: bool = False  # (low, ... rather than [low, ...
    high_open: bool = False
    integer: bool = False
    nullable: bool = False

    def allowed(self) -> str:
        kind = "an integer" if self.integer else "a finite number"
        if self.low == -INF and self.high == INF:
            return kind
        if self.high == INF:
            return f"{kind} {'>' if self.low_open else '>='} {_num(self.low)}"
        if self.low == -INF:
            return f"{kind} {'<' if self.high_open else '<='} {_num(self.high)}"
        left = "(" if self.low_open else "["
        right = ")" if self.high_open else "]"
        return f"{kind} in {left}{_num(self.low)}, {_num(self.high)}{right}"

    def check(self, key: str, value: object) -> None:
        if value is None and self.nullable:
            return
        if not self._ok(value):
            null = " or null" if self.nullable else ""
            raise ConfigError(f"{key}={_show(value)} must be {self.allowed()}{null}")

    def _ok(self, value: object) -> bool:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if self.integer and not isinstance(value, int):
            return False
        if not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


def _show(value: object) -> str:
    return repr(value) if isinstance(value, str) else str(value)


Choices = tuple[str, ...] | Callable[[], tuple[str, ...]]


class BoundArgs(TypedDict, total=False):
    """Bound's fields, as `bounded` takes them."""

    low: float
    high: float
    low_open: bool
    high_open: bool
    integer: bool
    nullable: bool


def bounded(default: T, **bound: Unpack[BoundArgs]) -> T:
    """A numeric field with its range: bounded(1e-3, low=0.0, high=1.0, low_open=True)."""
    return field(default=default, metadata={_BOUND: Bound(**bound)})


def positive_int(default: T, nullable: bool = False) -> T:
    return bounded(default, low=1, integer=True, nullable=nullable)


def count(default: T) -> T:
    """An integer where 0 means none (or off)."""
    return bounded(default, low=0, integer=True)


def fraction(default: T, low_open: bool = False, high_open: bool = False) -> T:
    return bounded(default, low=0.0, high=1.0, low_open=low_open, high_open=high_open)


def one_of(default: T, choices: Choices) -> T:
    """A named setting: one of `choices` (a tuple, or a function giving the registered names)."""
    return field(default=default, metadata={_CHOICES: choices})


def check_choice(key: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not allowed; choose one of: {', '.join(allowed)}")


def check_fields(config: DataclassInstance, prefix: str) -> None:
    """Every bound and choice declared on `config`'s fields, nested configs included, in the
    order the fields are declared."""
    for f in dataclasses.fields(config):
        key, value = f"{prefix}.{f.name}", getattr(config, f.name)
        if _BOUND in f.metadata:
            f.metadata[_BOUND].check(key, value)
        if _CHOICES in f.metadata:
            choices = f.metadata[_CHOICES]
            check_choice(key, value, choices() if callable(choices) else choices)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            check_fields(value, key)


def is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def auto_count(value: object) -> int | None:
    """An `auto | int` setting as the code reads it: the int, or None for auto. Anything else
    reads as None too: `auto_or_count` refuses it when the config is checked, before any use."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def auto_or_count(key: str, value: object, low: int, allowed: str, nullable: bool = False) -> None:
    """A setting that is `auto` (or null where `nullable`) or an integer >= low."""
    if value == "auto" or (nullable and value is None):
        return
    if not (is_count(value) and value >= low):
        raise ConfigError(f"{key}={value!r} must be {allowed}")
