"""The stock plugin's module, reduced to what tells it ran: its config node
(`hydra/sweeper=optuna`, the stock keys) and a sweeper that says where it was loaded from.
No `from __future__ import annotations`: Hydra's plugin scan runs a module before it is in
sys.modules, where a dataclass with string annotations cannot be built."""

from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.plugins.sweeper import Sweeper


@dataclass
class OptunaSweeperConf:
    _target_: str = "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"
    sampler: Any = None
    direction: Any = None
    storage: Any = None
    study_name: Any = None
    n_trials: Any = None
    n_jobs: Any = None
    max_failure_rate: Any = None
    search_space: Any = None
    params: Any = None
    custom_search_space: Any = None


ConfigStore.instance().store(
    group="hydra/sweeper", name="optuna", node=OptunaSweeperConf, provider="optuna_sweeper"
)


class OptunaSweeper(Sweeper):
    def __init__(self, **options: Any) -> None:
        self.options = options

    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        pass

    def sweep(self, arguments: list[str]) -> None:
        print(f"fake stock sweeper ran: {__file__}", flush=True)
