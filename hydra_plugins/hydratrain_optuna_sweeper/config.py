"""The config nodes this sweeper registers, with the stock hydra-optuna-sweeper's names.

Each stock key is declared once, in `STOCK_KEYS`: its stock default, the `hpo.*` setting it
maps onto (docs/hpo.md: how its stock meaning differs). Both sweeper nodes are made from it:

- `hydra/sweeper=optuna`: the stock node, its keys and defaults (n_trials 20 more trials per
  run, storage null = in memory, study_name null = a fresh study, n_jobs 2, max_failure_rate 0).
  Registered only when the stock plugin is not installed, so configs written for it run here.
- `hydra/sweeper=hydratrain_optuna`: what `hpo=optuna` selects. The same keys, unset (null):
  an unset key leaves the matching `hpo.*` setting in charge; a key that is set means what it
  means to the stock sweeper.
- `hydra/sweeper/sampler=NAME`: the stock sampler configs (`SAMPLERS` below: tpe, random,
  cmaes, ...) with their fields; a field left null takes Optuna's own default.

The sampler configs are copied from hydra-optuna-sweeper (Copyright (c) Facebook, Inc. and its
affiliates, MIT license): plugins/hydra_optuna_sweeper/hydra_plugins/hydra_optuna_sweeper/config.py.
"""

import copy
import importlib.util
from dataclasses import dataclass, field, make_dataclass
from types import UnionType
from typing import Any, NoReturn

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

SWEEPER_MODULE = "hydra_plugins.hydratrain_optuna_sweeper.optuna_sweeper"
MOTPE_TARGET = "hydra_plugins.hydratrain_optuna_sweeper.config.raise_motpe_removed"
MOTPE_REMOVED = (
    "The 'motpe' sampler was removed in Optuna 4.0. Use 'hydra/sweeper/sampler=tpe' instead. "
    "TPESampler now handles multi-objective optimization."
)


def raise_motpe_removed(*args: object, **kwargs: object) -> NoReturn:
    raise ValueError(MOTPE_REMOVED)


@dataclass
class SamplerConfig:
    _target_: str = MISSING


@dataclass
class GridSamplerConfig(SamplerConfig):
    _target_: str = "optuna.samplers.GridSampler"
    # search_space is built from the sweep's search space when the sweep starts
    _partial_: bool = True


@dataclass
class TPESamplerConfig(SamplerConfig):
    _target_: str = "optuna.samplers.TPESampler"
    seed: int | None = None
    consider_prior: bool | None = None
    prior_weight: float | None = None
    consider_magic_clip: bool | None = None
    consider_endpoints: bool | None = None
    n_startup_trials: int = 10
    n_ei_candidates: int = 24
    multivariate: bool = False
    warn_independent_sampling: bool | None = None


@dataclass
class RandomSamplerConfig(SamplerConfig):
    _target_: str = "optuna.samplers.RandomSampler"
    seed: int | None = None


@dataclass
class CmaEsSamplerConfig(SamplerConfig):
    _target_: str = "optuna.samplers.CmaEsSampler"
    seed: int | None = None
    x0: dict[str, Any] | None = None
    sigma0: float | None = None
    independent_sampler: Any = None
    warn_independent_sampling: bool = True
    consider_pruned_trials: bool = False
    restart_strategy: Any = None
    inc_popsize: int = 2
    use_separable_cma: bool = False
    source_trials: Any = None


@dataclass
class NSGAIISamplerConfig(SamplerConfig):
    _target_: str = "optuna.samplers.NSGAIISampler"
    seed: int | None = None
    population_size: int = 50
    mutation_prob: float | None = None
    crossover_prob: float = 0.9
    swapping_prob: float = 0.5
    constraints_func: Any = None


@dataclass
class MOTPESamplerConfig(SamplerConfig):
    _target_: str = MOTPE_TARGET


@dataclass
class GPSamplerConfig(SamplerConfig):
    _target_: str = "optuna.samplers.GPSampler"
    seed: int | None = None
    independent_sampler: Any = None
    n_startup_trials: int = 10
    deterministic_objective: bool = False
    constraints_func: Any = None
    warn_independent_sampling: bool = True


@dataclass
class QMCSamplerConfig(SamplerConfig):
    _target_: str = "optuna.samplers.QMCSampler"
    seed: int | None = None
    qmc_type: str = "sobol"
    scramble: bool = False
    independent_sampler: Any = None
    warn_asynchronous_seeding: bool = True
    warn_independent_sampling: bool = True


SAMPLERS: dict[str, type] = {
    "tpe": TPESamplerConfig,
    "random": RandomSamplerConfig,
    "cmaes": CmaEsSamplerConfig,
    "nsgaii": NSGAIISamplerConfig,
    "motpe": MOTPESamplerConfig,
    "grid": GridSamplerConfig,
    "gp": GPSamplerConfig,
    "qmc": QMCSamplerConfig,
}


@dataclass(frozen=True)
class StockKey:
    """One key of the stock sweeper's node, `hydra.sweeper.<name>`: declared here once, and
    mapped onto the `hpo.*` setting it stands in for. Both sweeper nodes are made from these."""

    name: str
    # The field's OmegaConf annotation. Any where the value may be a mapping or a list:
    # `hydra.sweeper.params={...}` on the command line then sets it (OmegaConf merges a
    # mapping neither into a null Dict nor new keys into a Dict).
    kind: type | UnionType
    default: object  # the stock node's default
    setting: str | None  # the hpo.* setting it replaces when set (None: it has none)


# One row per stock key: name, annotation, stock default, the hpo.* setting it replaces when
# set (how each stock meaning differs from that setting's: docs/hpo.md).
# fmt: off
STOCK_KEYS: tuple[StockKey, ...] = (
    StockKey("sampler", Any, MISSING, "hpo.sampler"),
    StockKey("direction", Any, "minimize", "hpo.direction"),
    StockKey("storage", Any, None, "hpo.storage"),
    StockKey("study_name", str | None, None, "hpo.study_name"),
    StockKey("n_trials", int, 20, "hpo.n_trials"),
    StockKey("n_jobs", int, 2, None),
    StockKey("max_failure_rate", float, 0.0, "hpo.max_failure_rate"),
    StockKey("params", Any, None, "hpo.params"),
    StockKey("custom_search_space", str | None, None, "hpo.search_space_fn"),
    StockKey("search_space", Any, None, "hpo.params"),
)
# fmt: on


def _node(name: str, target: str, defaults: list[object], stock: bool) -> type:
    """A sweeper node: the stock defaults, or every key unset (null) for the hpo.* settings."""
    fields: list[tuple[str, object, object]] = [
        ("_target_", str, f"{SWEEPER_MODULE}.{target}"),
        ("defaults", list[Any], field(default_factory=lambda: copy.deepcopy(defaults))),
        # The sweeper builds the sampler and a storage object itself, so a bad one is one line.
        ("_recursive_", bool, False),
    ]
    for k in STOCK_KEYS:
        unset = k.kind if k.kind is Any else k.kind | None
        fields.append((k.name, k.kind, k.default) if stock else (k.name, unset, None))
    return make_dataclass(name, fields, namespace={"__module__": __name__})


# hydra/sweeper=optuna: the stock keys with the stock defaults and meaning.
OptunaSweeperConf = _node("OptunaSweeperConf", "OptunaSweeper", [{"sampler": "tpe"}], True)
# hydra/sweeper=hydratrain_optuna (hpo=optuna): the stock keys, unset. Set, each means what it
# means to the stock sweeper and replaces the matching hpo.* setting.
HydratrainOptunaSweeperConf = _node(
    "HydratrainOptunaSweeperConf",
    "HydratrainOptunaSweeper",
    ["_self_", {"sampler": None}],
    False,
)


STOCK_PACKAGE = "hydra_plugins.hydra_optuna_sweeper"


def stock_plugin_installed() -> bool:
    """Whether the stock hydra-optuna-sweeper is installed: a regular package (with an
    `__init__.py`) of its name. Ours, hydra_plugins/hydra_optuna_sweeper/, is a namespace
    portion without one, which Python resolves only when no regular package exists."""
    spec = importlib.util.find_spec(STOCK_PACKAGE)
    return spec is not None and spec.origin not in (None, "namespace")


def _register() -> None:
    cs = ConfigStore.instance()
    cs.store(group="hydra/sweeper", name="hydratrain_optuna", node=HydratrainOptunaSweeperConf)
    # Never shadow the stock plugin when it is installed: its configs then get what they ask
    # for, and its sampler configs (the same names and fields) serve both sweepers.
    if not stock_plugin_installed():
        cs.store(group="hydra/sweeper", name="optuna", node=OptunaSweeperConf)
        for name, node in SAMPLERS.items():
            cs.store(group="hydra/sweeper/sampler", name=name, node=node)


_register()
