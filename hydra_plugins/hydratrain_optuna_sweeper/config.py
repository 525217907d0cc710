"""The config nodes this sweeper registers, with the stock hydra-optuna-sweeper's names.

- `hydra/sweeper=optuna`: the stock node, its keys and defaults (n_trials 20 more trials per
  run, storage null = in memory, study_name null = a fresh study, n_jobs 2, max_failure_rate 0).
  Registered only when the stock plugin is not installed, so configs written for it run here.
- `hydra/sweeper=hydratrain_optuna`: what `hpo=optuna` selects. The same keys, unset (null):
  an unset key leaves the matching `hpo.*` setting in charge; a key that is set means what it
  means to the stock sweeper.
- `hydra/sweeper/sampler=NAME`: the stock sampler configs (tpe, random, cmaes, nsgaii, motpe,
  grid, gp, qmc) with their fields; a field left null takes Optuna's own default.

The sampler configs are copied from hydra-optuna-sweeper (Copyright (c) Facebook, Inc. and its
affiliates, MIT license): plugins/hydra_optuna_sweeper/hydra_plugins/hydra_optuna_sweeper/config.py.
"""

import importlib.util
from dataclasses import dataclass, field
from typing import Any, NoReturn

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

SWEEPER_MODULE = "hydra_plugins.hydratrain_optuna_sweeper.optuna_sweeper"
MOTPE_TARGET = "hydra_plugins.hydratrain_optuna_sweeper.config.raise_motpe_removed"
MOTPE_REMOVED = (
    "The 'motpe' sampler was removed in Optuna 4.0. Use 'hydra/sweeper/sampler=tpe' instead. "
    "TPESampler now handles multi-objective optimization."
)


def raise_motpe_removed(*args: Any, **kwargs: Any) -> NoReturn:
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


@dataclass
class OptunaSweeperConf:
    """hydra/sweeper=optuna: the stock keys with the stock defaults and meaning."""

    _target_: str = f"{SWEEPER_MODULE}.OptunaSweeper"
    defaults: list[Any] = field(default_factory=lambda: [{"sampler": "tpe"}])
    # The sweeper builds the sampler and a storage object itself, so a bad one is one line.
    _recursive_: bool = False
    sampler: Any = MISSING
    direction: Any = "minimize"  # or a list: several objectives, from the returned tuple
    storage: Any = None  # null: in memory; a URL or path; or an object with _target_
    study_name: str | None = None  # null: a fresh, automatically named study
    n_trials: int = 20  # this many more trials per run
    n_jobs: int = 2  # trials handed to the launcher at once
    max_failure_rate: float = 0.0  # FAIL share of a batch above which the sweep stops
    # The search space. Typed Any: `hydra.sweeper.params={...}` on the command line then sets
    # it (OmegaConf can merge a mapping neither into a null Dict nor new keys into a Dict).
    params: Any = None
    custom_search_space: str | None = None  # dotted path of fn(cfg, trial)
    # The legacy {key: {type, low, high, ...}} form, read as the stock's 1.3.0 does, with its
    # deprecation warning; beside params it is ignored, with its warning.
    search_space: Any = None


@dataclass
class HydratrainOptunaSweeperConf:
    """hydra/sweeper=hydratrain_optuna (hpo=optuna): the stock keys, unset. Set, each means
    what it means to the stock sweeper and replaces the matching hpo.* setting."""

    _target_: str = f"{SWEEPER_MODULE}.HydratrainOptunaSweeper"
    defaults: list[Any] = field(default_factory=lambda: ["_self_", {"sampler": None}])
    _recursive_: bool = False
    sampler: Any = None  # hpo.sampler
    direction: Any = None  # hpo.direction
    storage: Any = None  # hpo.storage
    study_name: str | None = None  # hpo.study_name
    n_trials: int | None = None  # hpo.n_trials (study-wide); set here: more trials per run
    n_jobs: int | None = None  # 1
    max_failure_rate: float | None = None  # hpo.max_failure_rate
    params: Any = None  # hpo.params
    custom_search_space: str | None = None  # hpo.search_space_fn
    search_space: Any = None  # as stock (above); set alone, it replaces hpo.params too


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
