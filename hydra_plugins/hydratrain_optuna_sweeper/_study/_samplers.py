"""Samplers, built for the installed Optuna with one line for anything wrong.

Both `hydra/sweeper/sampler=NAME` (the stock configs, their fields) and `hpo.sampler=NAME`
(the same configs, `hpo.sampler_args` as their fields, seeded by `hpo.seed`) end here. A field
left null, or at the sampler's own default, is not passed, so a field this Optuna version
deprecated stays quiet until someone sets it; a field it does not know is one line.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Mapping

import optuna
from omegaconf import DictConfig, OmegaConf
from optuna.trial import FrozenTrial

from .._errors import SweepConfigError, first_line
from ..config import MOTPE_REMOVED, SAMPLERS
from ._space import Grid

ALIASES = {"nsga2": "nsgaii"}  # our earlier name
# hpo.sampler's arguments where measurement chose them over Optuna's defaults (a key that
# hpo.sampler_args sets wins). TPE: univariate with constant liar, whatever the installed
# Optuna's defaults, and a random start-up that follows the study's budget (`startup_trials`);
# the figures that chose them, and the commands that measure them: docs/benchmarks.md, "The
# default study's sampler" and "The default study against a grid".
MEASURED_ARGS: dict[str, dict[str, object]] = {
    "tpe": {"multivariate": False, "constant_liar": True},
}
# Samplers whose random start-up `startup_trials` sizes.
STARTUP_FOLLOWS_BUDGET = ("tpe",)
OPTUNA_STARTUP = 10  # TPESampler's own n_startup_trials


def startup_trials(trials: float | None) -> int:
    """TPE's random start-up for a study of `trials` trials (or full trials' worth): a quarter
    of them, at most Optuna's 10. On the default study (20 trials' worth), two seeds, 5 random
    trials instead of 10 came within 5 % of the best in 646 and 1,022 s instead of 1,238 and
    973 s (docs/benchmarks.md, "The default study against a grid")."""
    if trials is None:
        return OPTUNA_STARTUP
    return max(1, min(OPTUNA_STARTUP, int(trials // 4)))


# Fields that mean something only beside another: the stock cmaes config sets inc_popsize=2,
# which sizes restarts, and Optuna >= 4.4 warns about it even with no restart_strategy.
ONLY_WITH = {"inc_popsize": "restart_strategy"}


def sampler_node(
    stock_sampler: object,
    sampler: str,
    args: Mapping[str, object],
    seed: int | None,
    trials: float | None,
) -> DictConfig:
    """The sampler's config node: hydra.sweeper.sampler when set (the stock config, its fields
    and defaults), else hpo.sampler with hpo.sampler_args (`args`) as its arguments, checked
    against the installed Optuna's signature of that sampler (every argument it takes,
    nothing copied), and hpo.seed as its seed. `trials`: the study's budget in trials (or
    full trials' worth), which sizes TPE's random start-up."""
    if stock_sampler is not None:
        return OmegaConf.create(_plain(stock_sampler))
    name = ALIASES.get(sampler, sampler)
    if name not in SAMPLERS:
        allowed = ", ".join(sampler_names())
        raise SweepConfigError(f"hpo.sampler={sampler!r} is not allowed; choose one of: {allowed}")
    target = _target_of(name)
    if target.endswith("raise_motpe_removed"):  # said when the sampler is built
        return OmegaConf.structured(SAMPLERS[name])
    params = _arguments(_sampler_class(target, "hpo.sampler"))
    for key in args:
        if key not in params or key == "search_space":  # the grid's: the sweep's space
            known = ", ".join(p for p in params if p != "search_space")
            raise SweepConfigError(
                f"hpo.sampler_args.{key}: no such argument of {target.rsplit('.', 1)[-1]} in "
                f"Optuna {optuna.__version__}; its arguments: {known}"
            )
    node: dict[str, object] = {"_target_": target, **MEASURED_ARGS.get(name, {})}
    if name in STARTUP_FOLLOWS_BUDGET:
        node["n_startup_trials"] = startup_trials(trials)
    node.update(args)
    if "seed" in params and "seed" not in args:
        node["seed"] = seed
    return OmegaConf.create(node)


def sampler_names() -> tuple[str, ...]:
    """The names hpo.sampler takes: the stock sampler configs Optuna still has (motpe is one
    line saying it was removed)."""
    return tuple(sorted(n for n in SAMPLERS if n != "motpe"))


def _target_of(name: str) -> str:
    """The class path of a sampler of the `hydra/sweeper/sampler` group."""
    return str(next(f.default for f in dataclasses.fields(SAMPLERS[name]) if f.name == "_target_"))


def _arguments(cls: type) -> list[str]:
    """The keyword arguments a sampler class takes."""
    kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [n for n, p in _parameters(cls).items() if n != "self" and p.kind in kinds]


def build_sampler(
    node: DictConfig, key: str, grid: Callable[[], Grid], n_objectives: int, oom: bool
) -> optuna.samplers.BaseSampler:
    """The sampler; `grid()` gives GridSampler its values. `oom`: avoid trials that ran out of
    memory (Optuna 4.x reads that from the sampler's constraints_func)."""
    plain = _plain(node)
    target = str(plain.get("_target_") or "")
    if target.endswith("raise_motpe_removed"):
        raise SweepConfigError(f"{key}=motpe: {MOTPE_REMOVED}")
    cls = _sampler_class(target, key)
    kwargs = {k: v for k, v in plain.items() if not k.startswith("_")}
    if cls is optuna.samplers.GridSampler:
        kwargs["search_space"] = grid()
    if cls is optuna.samplers.CmaEsSampler and n_objectives > 1:
        raise SweepConfigError(
            f"{key}: CmaEsSampler optimizes one objective, this study has {n_objectives}"
        )
    passthrough: dict[str, Callable[[FrozenTrial], list[float]]] = {}
    if oom and not TRIAL_CONSTRAINTS and "constraints_func" in _parameters(cls):
        passthrough["constraints_func"] = oom_constraint
    return _instantiate(cls, target, _effective(cls, kwargs, key), passthrough, key)


def _sampler_class(target: str, key: str) -> type[optuna.samplers.BaseSampler]:
    from hydra.utils import get_class

    try:
        cls = get_class(target)
    except Exception as e:
        raise SweepConfigError(
            f"{key}._target_={target!r} cannot be imported: {first_line(e)}"
        ) from None
    if not (isinstance(cls, type) and issubclass(cls, optuna.samplers.BaseSampler)):
        raise SweepConfigError(f"{key}._target_={target!r} is not an Optuna sampler")
    return cls


def _parameters(cls: type) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(cls).parameters)


def _effective(cls: type, kwargs: dict[str, object], key: str) -> dict[str, object]:
    """The fields to pass: set, known to this Optuna, and not the sampler's own default."""
    params = _parameters(cls)
    out = {}
    for name, value in kwargs.items():
        if value is None or (name in ONLY_WITH and kwargs.get(ONLY_WITH[name]) is None):
            continue
        if name not in params and value == _stock_default(cls, name):
            continue  # the stock config's default for a parameter this Optuna does not have
        if name not in params:
            known = ", ".join(p for p in params if p != "self")
            raise SweepConfigError(
                f"{key}.{name}={value!r} is not a parameter of {cls.__name__} in Optuna "
                f"{optuna.__version__}; its parameters: {known}"
            )
        default = params[name].default
        if type(value) is type(default) and value == default:
            continue
        out[name] = value
    return out


def _stock_default(cls: type, name: str) -> object:
    """The stock sampler config's default for `name`, or a value no user setting equals."""
    target = f"{cls.__module__.split('._')[0]}.{cls.__name__}"  # optuna.samplers.TPESampler
    for config in SAMPLERS.values():
        for f in dataclasses.fields(config):
            if f.name == "_target_" and f.default == target:
                match = [g for g in dataclasses.fields(config) if g.name == name]
                return match[0].default if match else _NO_DEFAULT
    return _NO_DEFAULT


_NO_DEFAULT = object()


def _instantiate(
    cls: type[optuna.samplers.BaseSampler],
    target: str,
    kwargs: dict[str, object],
    passthrough: Mapping[str, object],
    key: str,
) -> optuna.samplers.BaseSampler:
    from hydra.utils import instantiate

    try:
        sampler = instantiate({"_target_": target, "_convert_": "all", **kwargs}, **passthrough)
    except Exception as e:
        cause = e.__cause__ or e
        raise SweepConfigError(
            f"{key}: {cls.__name__}({kwargs}) failed: {first_line(cause)}"
        ) from None
    return sampler


def _plain(node: object) -> dict[str, object]:
    """A sampler config (a node or a mapping) as a plain dict."""
    plain = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
    if not isinstance(plain, Mapping):
        raise SweepConfigError(f"hydra.sweeper.sampler={plain!r} must be a sampler config")
    return {str(k): v for k, v in plain.items()}


def oom_constraint(trial: FrozenTrial) -> list[float]:
    """Optuna 4.x constraint: > 0 (violated) for trials that ran out of memory. TPE, GP and
    NSGA-II rank infeasible trials below feasible ones, so the sampler avoids what does not fit."""
    return [1.0 if trial.user_attrs.get("reason") == "oom" else 0.0]


TRIAL_CONSTRAINTS = hasattr(optuna.trial.Trial, "set_constraint")  # Optuna >= 5
OOM = "oom"  # the constraint a trial that ran out of memory breaks


def record_oom_constraint(trial: optuna.Trial, oom: bool) -> None:
    """Optuna >= 5: mark the trial feasible (0) or not (1, it ran out of memory)."""
    if TRIAL_CONSTRAINTS:
        trial.set_constraint(OOM, 1.0 if oom else 0.0)


def grid_size(grid: Grid) -> int:
    return math.prod(len(v) for v in grid.values())
