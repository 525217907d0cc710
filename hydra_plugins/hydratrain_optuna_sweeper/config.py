"""The sweeper's config node, registered as `hydra/sweeper=hydratrain_optuna`.

Besides our own keys it accepts the keys of Hydra's stock Optuna sweeper (sampler, direction,
study_name, storage, n_trials, n_jobs, max_failure_rate, custom_search_space) so configs written
for it run unchanged; when set they take precedence over the matching `hpo.*` setting.
"""

import importlib.util
from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore

SWEEPER_TARGET = "hydra_plugins.hydratrain_optuna_sweeper.optuna_sweeper.HydratrainOptunaSweeper"


@dataclass
class HydratrainOptunaSweeperConf:
    _target_: str = SWEEPER_TARGET
    # Search space: `key: <override expression>` (choice, range, interval, tag(log, ...), int()).
    params: dict[str, Any] | None = None
    # Stock-sweeper keys; None means "use hpo.*".
    sampler: Any = None
    direction: Any = None
    study_name: str | None = None
    storage: Any = None
    n_trials: int | None = None
    n_jobs: int | None = None
    max_failure_rate: float | None = None
    custom_search_space: str | None = None


def _register() -> None:
    cs = ConfigStore.instance()
    cs.store(group="hydra/sweeper", name="hydratrain_optuna", node=HydratrainOptunaSweeperConf)
    # Configs written for the stock plugin say `override hydra/sweeper: optuna`. Answer to that
    # name too, but never shadow the stock plugin when it is installed.
    if importlib.util.find_spec("hydra_plugins.hydra_optuna_sweeper") is None:
        cs.store(group="hydra/sweeper", name="optuna", node=HydratrainOptunaSweeperConf)


_register()
