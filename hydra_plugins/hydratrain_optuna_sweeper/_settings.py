"""`hpo.*` settings: read once, checked before any trial runs, turned into Optuna objects.

Every check raises `SweepConfigError` with one line that names the setting, so a bad sweep
fails at once instead of after the first training run.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hydra.errors import CompactHydraException
from omegaconf import DictConfig, OmegaConf

SAMPLERS = ("tpe", "random", "cmaes", "gp", "qmc", "nsga2")
PRUNERS = ("median", "successive_halving", "hyperband", "none")
DIRECTIONS = ("minimize", "maximize")
# A sampler that cannot handle several objectives would silently optimize only the first.
MULTI_OBJECTIVE_SAMPLERS = ("tpe", "random", "gp", "qmc", "nsga2")
# Step 0 is the untrained model (the trainer evaluates it): never prune there.
PRUNER_DEFAULTS = {"median": {"n_startup_trials": 3, "n_warmup_steps": 1}}


class SweepConfigError(CompactHydraException):
    """A sweep setting the user can fix. Hydra prints only the message (one line)."""


@dataclass
class HpoSettings:
    study_name: str
    storage: str | None
    n_trials: int
    directions: list[str]
    metrics: list[str]
    report_metric: str
    sampler: str = "tpe"
    sampler_args: dict[str, Any] = field(default_factory=dict)
    sampler_object: Any = None  # a sampler instantiated by a stock config (`_target_`)
    seed: int | None = 0
    pruner: str = "median"
    pruner_args: dict[str, Any] = field(default_factory=dict)
    max_failure_rate: float = 0.5
    min_trials_for_failure_rate: int = 4
    heartbeat_interval: float = 30.0
    stale_after: float = 120.0
    retry_stale: int = 0
    wait_for_running: bool = True
    poll_interval: float = 2.0
    enqueue: list[dict[str, Any]] = field(default_factory=list)
    search_space_fn: str | None = None
    tensorboard: bool = True

    @property
    def multi_objective(self) -> bool:
        return len(self.directions) > 1


def _plain(node: Any) -> Any:
    if isinstance(node, DictConfig) or OmegaConf.is_config(node):
        return OmegaConf.to_container(node, resolve=True)
    return node


def _as_list(value: Any) -> list[Any]:
    value = _plain(value)
    if isinstance(value, str) or not isinstance(value, Sequence):
        return [value]
    return list(value)


def read_settings(hpo: Any, stock: Mapping[str, Any]) -> HpoSettings:
    """Merge `hpo.*` with the stock-sweeper keys (those win when set) and check the result."""
    h: dict[str, Any] = _plain(hpo) or {}
    pick = {k: v for k, v in stock.items() if v is not None}
    sampler, sampler_args, sampler_object = _read_sampler(h, pick.get("sampler"))
    s = HpoSettings(
        study_name=str(pick.get("study_name", h.get("study_name") or "hydratrain")),
        storage=_plain(pick.get("storage", h.get("storage"))),
        n_trials=pick.get("n_trials", h.get("n_trials", 20)),
        directions=[
            str(d) for d in _as_list(pick.get("direction", h.get("direction", "minimize")))
        ],
        metrics=[str(m) for m in _as_list(h.get("metric", "final_val_loss"))],
        report_metric=str(h.get("report_metric", "val_loss")),
        sampler=sampler,
        sampler_args=sampler_args,
        sampler_object=sampler_object,
        seed=h.get("seed", 0),
        pruner=str(h.get("pruner", "median")),
        pruner_args=dict(h.get("pruner_args") or {}),
        max_failure_rate=float(pick.get("max_failure_rate", h.get("max_failure_rate", 0.5))),
        min_trials_for_failure_rate=int(h.get("min_trials_for_failure_rate", 4)),
        heartbeat_interval=float(h.get("heartbeat_interval", 30.0)),
        stale_after=float(h.get("stale_after", 120.0)),
        retry_stale=int(h.get("retry_stale", 0)),
        wait_for_running=bool(h.get("wait_for_running", True)),
        poll_interval=float(h.get("poll_interval", 2.0)),
        enqueue=list(h.get("enqueue") or []),
        search_space_fn=pick.get("custom_search_space", h.get("search_space_fn")),
        tensorboard=bool(h.get("tensorboard", True)),
    )
    check(s)
    return s


def _read_sampler(h: dict[str, Any], stock: Any) -> tuple[str, dict[str, Any], Any]:
    name = str(h.get("sampler", "tpe"))
    args = dict(h.get("sampler_args") or {})
    if stock is None:
        return name, args, None
    stock = _plain(stock)
    if isinstance(stock, str):
        return stock, args, None
    if isinstance(stock, Mapping):  # stock config without _target_: kwargs such as {seed: 123}
        return name, {**args, **stock}, None
    return type(stock).__name__, args, stock  # already instantiated by Hydra


def check(s: HpoSettings) -> None:
    if not isinstance(s.n_trials, int) or isinstance(s.n_trials, bool) or s.n_trials < 1:
        raise SweepConfigError(f"hpo.n_trials={s.n_trials!r} must be a positive integer")
    for d in s.directions:
        if d not in DIRECTIONS:
            raise SweepConfigError(
                f"hpo.direction={d!r} is not allowed; choose one of: minimize, maximize"
            )
    if len(s.directions) != len(s.metrics):
        raise SweepConfigError(
            f"hpo.direction has {len(s.directions)} entries but hpo.metric has {len(s.metrics)}; "
            "give one direction per metric"
        )
    if s.sampler_object is None:
        _check_sampler(s)
    if s.pruner not in PRUNERS:
        raise SweepConfigError(
            f"hpo.pruner={s.pruner!r} is not allowed; choose one of: {', '.join(PRUNERS)}"
        )
    if not 0.0 <= s.max_failure_rate <= 1.0:
        raise SweepConfigError(f"hpo.max_failure_rate={s.max_failure_rate} must be in [0, 1]")
    for key in ("heartbeat_interval", "stale_after", "poll_interval"):
        value = getattr(s, key)
        if not (value > 0 and math.isfinite(value)):
            raise SweepConfigError(f"hpo.{key}={value} must be a positive number of seconds")
    if s.stale_after <= s.heartbeat_interval:
        raise SweepConfigError(
            f"hpo.stale_after={s.stale_after} must exceed hpo.heartbeat_interval="
            f"{s.heartbeat_interval}, or live trials would be failed as stale"
        )


def _check_sampler(s: HpoSettings) -> None:
    if s.sampler not in SAMPLERS:
        raise SweepConfigError(
            f"hpo.sampler={s.sampler!r} is not allowed; choose one of: {', '.join(SAMPLERS)}"
        )
    if s.multi_objective and s.sampler not in MULTI_OBJECTIVE_SAMPLERS:
        raise SweepConfigError(
            f"hpo.sampler={s.sampler} cannot optimize {len(s.metrics)} objectives; "
            f"use one of: {', '.join(MULTI_OBJECTIVE_SAMPLERS)}"
        )
    needs = {"cmaes": ("cmaes",), "gp": ("scipy", "torch"), "qmc": ("scipy",)}.get(s.sampler, ())
    for module in needs:
        if importlib.util.find_spec(module) is None:
            raise SweepConfigError(
                f"hpo.sampler={s.sampler} needs the '{module}' package (pip install {module})"
            )


def oom_constraint(trial: Any) -> list[float]:
    """Optuna constraint: > 0 (violated) for trials that ran out of memory.

    TPE, GP and NSGA-II rank infeasible trials below feasible ones, so the sampler learns to
    avoid settings that do not fit.
    """
    return [1.0 if trial.user_attrs.get("reason") == "oom" else 0.0]


def _trial_has_constraints() -> bool:
    from optuna.trial import Trial

    return hasattr(Trial, "set_constraint")


TRIAL_CONSTRAINTS = _trial_has_constraints()


def record_oom_constraint(trial: Any, oom: bool) -> None:
    """Optuna >= 5: mark the trial feasible (0) or not (1, it ran out of memory)."""
    if TRIAL_CONSTRAINTS:
        trial.set_constraint("oom", 1.0 if oom else 0.0)


def _accepts(cls: type, name: str) -> bool:
    return name in inspect.signature(cls.__init__).parameters


def build_sampler(s: HpoSettings) -> Any:
    import optuna

    if s.sampler_object is not None:
        return s.sampler_object
    cls = {
        "tpe": optuna.samplers.TPESampler,
        "random": optuna.samplers.RandomSampler,
        "cmaes": optuna.samplers.CmaEsSampler,
        "gp": optuna.samplers.GPSampler,
        "qmc": optuna.samplers.QMCSampler,
        "nsga2": optuna.samplers.NSGAIISampler,
    }[s.sampler]
    kwargs: dict[str, Any] = {"seed": s.seed, **s.sampler_args}
    # Optuna 5 reads constraints set on the trial (see `record_oom_constraint`); 4.x needs the
    # sampler's constraints_func, where the sampler accepts one.
    if not TRIAL_CONSTRAINTS and _accepts(cls, "constraints_func"):
        kwargs.setdefault("constraints_func", oom_constraint)
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise SweepConfigError(
            f"hpo.sampler_args={s.sampler_args} do not fit {cls.__name__}: {e}"
        ) from None


def build_pruner(s: HpoSettings) -> Any:
    import optuna

    if s.multi_objective:  # Optuna cannot prune multi-objective trials
        return optuna.pruners.NopPruner()
    if s.pruner == "none":
        return optuna.pruners.NopPruner()
    cls = {
        "median": optuna.pruners.MedianPruner,
        "successive_halving": optuna.pruners.SuccessiveHalvingPruner,
        "hyperband": optuna.pruners.HyperbandPruner,
    }[s.pruner]
    args = {**PRUNER_DEFAULTS.get(s.pruner, {}), **s.pruner_args}
    try:
        return cls(**args)
    except TypeError as e:
        raise SweepConfigError(
            f"hpo.pruner_args={s.pruner_args} do not fit {cls.__name__}: {e}"
        ) from None
