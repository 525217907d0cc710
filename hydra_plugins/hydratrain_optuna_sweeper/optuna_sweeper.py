"""The Sweepers Hydra instantiates. Thin on purpose: Optuna is imported only when a sweep runs.

`OptunaSweeper` answers to `hydra/sweeper=optuna` (stock keys, stock defaults);
`HydratrainOptunaSweeper` to `hydra/sweeper=hydratrain_optuna`, which `hpo=optuna` selects.
They differ only in what an unset (null) `storage` and `study_name` mean.
"""

from __future__ import annotations

from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from .config import HydratrainOptunaSweeperConf  # noqa: F401  (registers the config nodes)


class OptunaSweeper(Sweeper):
    stock_node = True  # null storage: in memory; null study_name: a fresh study

    def __init__(self, **options: object) -> None:
        from ._sweep._plan import OptunaSweeperImpl

        self.sweeper = OptunaSweeperImpl(options, stock_node=self.stock_node)

    def setup(
        self,
        *,
        hydra_context: HydraContext,
        task_function: TaskFunction,
        config: DictConfig,
    ) -> None:
        self.sweeper.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> None:
        self.sweeper.sweep(arguments)


class HydratrainOptunaSweeper(OptunaSweeper):
    stock_node = False  # null storage and study_name: hpo.storage and hpo.study_name
