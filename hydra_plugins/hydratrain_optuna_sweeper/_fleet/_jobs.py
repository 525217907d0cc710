"""A fleet through the configured Hydra launcher: `hpo.workers` long-lived jobs, not one job per
trial (`hydra/launcher=submitit_slurm` on a cluster; submitit_local and joblib on one node).

The launcher gets N jobs in one `launch()` call. Each job's task is `FleetJob`: the ordinary
one-process worker (this sweeper, with Hydra's basic launcher, so its trials run in the job's
process) pulling trials from the shared study until its budget is spent. The launcher's own
`launch()` returns when every job has ended, which is what the parent waits for; meanwhile it
prints one line per finished trial from the study.

Signals belong to the jobs: SLURM sends SIGTERM to a job it preempts or cancels, and the
worker preempts its trial (a checkpoint; the trial is queued again with the same parameters)
and ends; with `--requeue` SLURM starts the job again and it rejoins the study. A job killed
outright leaves its trial RUNNING: it is failed as stale after hpo.stale_after and retried
per hpo.retry_stale.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict, read_write

from .. import _private as private
from .._study._fleet_plan import FleetPlan
from ._local import TrialTicker, ending

log = logging.getLogger(__name__)


@dataclass
class FleetJob:
    """The task of one launched job: worker <hydra.job.num> of the fleet. Pickled by the
    launcher (cloudpickle), so it holds what a sweeper needs, not a sweeper."""

    sweeper_cls: Callable[[Mapping[str, object], bool], Sweeper]  # OptunaSweeperImpl
    options: Mapping[str, object]
    stock_node: bool
    hydra_context: HydraContext
    task_function: TaskFunction
    config: DictConfig  # the sweep's config, with the basic launcher
    arguments: list[str]
    envs: list[dict[str, str]]  # each worker's WORKER_ENV and CUDA_VISIBLE_DEVICES

    def __call__(self, cfg: DictConfig) -> int:
        from hydra.core.hydra_config import HydraConfig

        # Before anything in this process starts CUDA: the trials run here.
        os.environ.update(self.envs[int(HydraConfig.get().job.num)])
        sweeper = self.sweeper_cls(self.options, self.stock_node)
        sweeper.setup(
            hydra_context=self.hydra_context, task_function=self.task_function, config=self.config
        )
        try:
            sweeper.sweep(list(self.arguments))
        except SystemExit as e:
            if isinstance(e.code, int) and e.code >= 0:  # the worker's status: the job's result
                return e.code
            raise  # the launcher's own exit (submitit's, once it requeued a timed-out job)
        return 0


def launch_fleet(
    job: FleetJob, master: DictConfig, plan: FleetPlan, ticker: TrialTicker, poll: float
) -> int:
    """Launch the fleet's jobs through the configured launcher and wait for them; the status
    says whether every worker ended cleanly (as a local fleet's does)."""
    launcher = Plugins.instance().instantiate_launcher(
        hydra_context=job.hydra_context, task_function=job, config=master
    )
    overrides = [[f"hydra.sweep.subdir=workers/worker_{i}"] for i in range(plan.workers)]
    with ticker.in_background(poll):
        returns = launcher.launch(overrides, initial_job_idx=0)
    statuses = []
    for i, ret in enumerate(returns):
        value, exc = private.job_result(ret)
        if exc is not None:
            log.warning("worker %d failed: %s", i, exc)
        statuses.append((f"worker {i}", value if isinstance(value, int) else 1))
    return ending(statuses, str(master.hydra.sweep.dir), signum=None)


def worker_config(hydra_context: HydraContext, master: DictConfig) -> DictConfig:
    """The sweep's config for a job's worker: Hydra's basic launcher runs its trials in the
    job's own process, in the sweep directory this process chose."""
    basic = hydra_context.config_loader.load_sweep_config(master, ["hydra/launcher=basic"])
    config = copy.deepcopy(master)
    with read_write(config), open_dict(config):
        config.hydra.launcher = basic.hydra.launcher
        config.hydra.sweep.dir = str(master.hydra.sweep.dir)
    return config
