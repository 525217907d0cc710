"""Optimizers, one module each, found by name (`training.optimizer`).

An optimizer module registers an `Optimizer`: how to build it, the bytes of state it keeps per
parameter (the memory preflight counts them, the micro-batch cache keys on them) and its own
settings (`training.optimizer_args`, checked against its `Args`). Every optimizer decays
matrices only: biases and norm gains (1-D) are not decayed, shrinking them towards zero only
hurts. Under μP (model.parametrization=mup) the hidden matrices get groups of their own, one per
width multiplier, whose learning rate is divided by width_mult ** `mup_exponent` and weight
decay multiplied by it (the decay per step, lr x weight_decay, unchanged).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from app.core.errors import ConfigError
from app.core.fields import check_fields
from app.core.registry import Registry

if TYPE_CHECKING:
    import torch
    from _typeshed import DataclassInstance


class OptimizerSettings(Protocol):
    """What an optimizer reads of `training.*` (TrainingConfig has these fields)."""

    @property
    def optimizer(self) -> str: ...

    @property
    def optimizer_args(self) -> object: ...  # a mapping, checked against the optimizer's Args

    @property
    def lr(self) -> float: ...

    @property
    def betas(self) -> list[float]: ...

    @property
    def eps(self) -> float: ...

    @property
    def weight_decay(self) -> float: ...

    @property
    def fused_adamw(self) -> bool | None: ...


@dataclass
class NoArgs:
    """An optimizer with no settings of its own beyond training.*."""


# One parameter group as torch optimizers take it: {"params": [...], "weight_decay": 0.0}
ParamGroup = dict[str, "list[torch.nn.Parameter] | float"]
A = TypeVar("A", bound="DataclassInstance")


@dataclass(frozen=True)
class HiddenMatrices:
    """μP's hidden matrices (app/components/models/mup/apply.py), each with its width
    multiplier: its fan-in over the base model's."""

    mults: Mapping[int, float]  # id(parameter) -> width multiplier


class OptimizerKind(Protocol):
    """An optimizer as the run sees it, whatever its own settings' type."""

    @property
    def name(self) -> str: ...

    @property
    def label(self) -> str: ...

    @property
    def state_bytes_per_param(self) -> float: ...

    @property
    def steps_shards(self) -> bool: ...

    @property
    def mup_exponent(self) -> float: ...

    def check(self, training: OptimizerSettings) -> None: ...

    def create(
        self,
        model: torch.nn.Module,
        training: OptimizerSettings,
        hidden: HiddenMatrices | None = None,
    ) -> torch.optim.Optimizer: ...

    def cache_identity(self, training: OptimizerSettings) -> list[object]: ...


@dataclass(frozen=True)
class Optimizer(Generic[A]):
    name: str  # training.optimizer=NAME
    label: str  # as a message names it: "AdamW"
    # (parameter groups, training settings, its Args) -> torch optimizer
    build: Callable[[list[ParamGroup], OptimizerSettings, A], torch.optim.Optimizer]
    # fp32 optimizer state per parameter, at most (AdamW's two moments: 8)
    state_bytes_per_param: float
    args: type[A]  # its settings: training.optimizer_args (NoArgs: none of its own)
    uses_betas: bool = False  # reads training.betas (two moving averages)
    # What besides the name changes its memory per step (the micro-batch cache keys on it)
    memory_identity: Callable[[OptimizerSettings], list[object]] = lambda t: []
    steps_shards: bool = True  # steps FSDP's sharded (DTensor) parameters
    # μP divides a hidden matrix's rate by width_mult ** this: 1 where an update's entries are
    # about lr whatever the weight (Adam's normalized step, Lion's sign); 0.5 where the step is
    # relative to the weight's RMS, which μP's init makes ∝ 1/sqrt(fan_in) (Adafactor)
    mup_exponent: float = 1.0

    def check(self, training: OptimizerSettings) -> None:
        """The settings this optimizer reads, before any work."""
        self.parse_args(training.optimizer_args)
        check_decoupled_decay(training)
        if self.uses_betas:
            check_betas(training)

    def parse_args(self, given: object) -> A:
        """training.optimizer_args as this optimizer's Args (unknown fields refused)."""
        if given is None:
            given = {}
        if not isinstance(given, Mapping):
            raise ConfigError(f"training.optimizer_args={given!r} must be a mapping of key: value")
        known = {f.name for f in dataclasses.fields(self.args)}
        for key in given:
            if str(key) not in known:
                allowed = ", ".join(sorted(known)) or "none"
                raise ConfigError(
                    f"training.optimizer_args.{key}: no such setting of training.optimizer="
                    f"{self.name}; known: {allowed}"
                )
        args = self.args(**{str(k): v for k, v in given.items()})
        check_fields(args, "training.optimizer_args")
        return args

    def create(
        self,
        model: torch.nn.Module,
        training: OptimizerSettings,
        hidden: HiddenMatrices | None = None,
    ) -> torch.optim.Optimizer:
        """`hidden`: μP's hidden matrices (None: the standard parametrization)."""
        groups = param_groups(model, training, hidden, self.mup_exponent)
        return self.build(groups, training, self.parse_args(training.optimizer_args))

    def cache_identity(self, training: OptimizerSettings) -> list[object]:
        return [self.name, *self.memory_identity(training)]


OPTIMIZERS: Registry[OptimizerKind] = Registry(__name__, "training.optimizer")


def param_groups(
    model: torch.nn.Module, t: OptimizerSettings, hidden: HiddenMatrices | None, exponent: float
) -> list[ParamGroup]:
    """Matrices decayed, vectors (biases, norm gains) not. Under μP (`hidden`) the hidden
    matrices are apart: the other matrices (embeddings) first, at the rate as given (the one
    logged as train/learning_rate), then one group per width multiplier (its rate / mult**
    exponent, its decay x the same), then the vectors."""
    mults = hidden.mults if hidden is not None else {}
    trainable = [p for p in model.parameters() if p.requires_grad]
    matrices = [p for p in trainable if p.dim() >= 2]
    groups: list[ParamGroup] = [
        {"params": [p for p in matrices if id(p) not in mults], "weight_decay": t.weight_decay}
    ]
    for mult in sorted({mults[id(p)] for p in matrices if id(p) in mults}):
        scale = mult**exponent
        own = [p for p in matrices if mults.get(id(p)) == mult]
        groups.append({"params": own, "lr": t.lr / scale, "weight_decay": t.weight_decay * scale})
    return [*groups, {"params": [p for p in trainable if p.dim() < 2], "weight_decay": 0.0}]


def check_decoupled_decay(t: OptimizerSettings) -> None:
    # Decoupled decay multiplies every weight by (1 - lr * weight_decay) per step.
    if t.lr * t.weight_decay >= 1.0:
        raise ConfigError(
            f"training.weight_decay={t.weight_decay} with training.lr={t.lr} shrinks every weight "
            f"by lr*weight_decay={t.lr * t.weight_decay:g} per step; allowed: lr*weight_decay < 1"
        )


def check_betas(t: OptimizerSettings) -> None:
    betas = list(t.betas)
    if len(betas) != 2 or not all(_is_number(b) and 0.0 <= b < 1.0 for b in betas):
        raise ConfigError(f"training.betas={betas} must be two numbers in [0, 1)")


def _is_number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)
