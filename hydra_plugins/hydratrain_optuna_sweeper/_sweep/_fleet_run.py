"""The sweeper's side of a fleet: decide it first among the settings, start it (a local
fleet's workers start before the parent checks the search space and opens the study), then
run it in the place of the lone worker: processes of this node under Hydra's basic launcher,
jobs of any other launcher (`_fleet_jobs`)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from omegaconf import DictConfig

from app.components.hardware.visible import visible_gpus

from .._errors import SweepConfigError
from .._fleet._gpu_share import check_shared_gpus
from .._fleet._jobs import FleetJob, launch_fleet
from .._fleet._local import LocalFleet, TrialTicker
from .._study._fleet_plan import FleetPlan, fleet_worker, plan_fleet
from .._study._settings import SweepSettings

if TYPE_CHECKING:
    from ._worker import Plan

log = logging.getLogger(__name__)


@dataclass
class Fleet:
    """A fleet of workers, with what running it needs: its plan, the sweep's config (whose
    launcher starts a launcher fleet's jobs), and how to make the job each launched worker
    runs (built only for such a fleet: it composes the config once more)."""

    plan: FleetPlan
    config: DictConfig
    make_job: Callable[[FleetPlan], FleetJob]
    workers: LocalFleet | None = None  # a local fleet's processes, once started

    @property
    def local(self) -> bool:
        return runs_here(self.config)

    @contextlib.contextmanager
    def started(self, s: SweepSettings, sweep_dir: str, storage: str) -> Iterator[None]:
        """Say what the fleet is; a local fleet's workers start now, while the body prepares
        the study and runs the fleet (`LocalFleet.started`), a launcher's jobs in `run`.
        `storage`: hpo.storage as the log may show it."""
        where = "processes of this node" if self.local else "jobs of the configured launcher"
        log.info(
            "Fleet: %s as %s, study in %s; logs in %s/workers",
            self.plan.describe(),
            where,
            storage,
            sweep_dir,
        )
        if not self.local:
            yield
            return
        self.workers = LocalFleet(self.plan, s, sweep_dir)
        with self.workers.started():
            yield

    def run(self, plan: Plan) -> int:
        """Run the fleet on `plan.study` until its budget is spent (inside `started`); the
        fleet's status."""
        s = plan.settings
        try:
            if self.local:
                assert self.workers is not None, "a local fleet runs inside started()"
                return self.workers.watch(plan.study)
            ticker = TrialTicker(plan.study)
            job = self.make_job(self.plan)
            return launch_fleet(job, self.config, self.plan, ticker, s.liveness.poll_interval)
        finally:
            plan.write_results(final=True)


def runs_here(config: DictConfig) -> bool:
    """Hydra's basic launcher runs jobs one after another in this process: a fleet's workers
    are then processes of this node."""
    choices = config.hydra.runtime.choices
    return str(choices.get("hydra/launcher", "basic")) == "basic"


def plan_fleet_of(
    s: SweepSettings, config: DictConfig, make_job: Callable[[FleetPlan], FleetJob]
) -> Fleet | None:
    """The fleet hpo.workers asks for (`s.fleet`), checked; None for a lone worker (or a
    fleet's own)."""
    ask = s.fleet
    if ask is None:
        return None
    # A launcher's jobs run on the nodes it picks, with the devices it gives them: this
    # node's GPUs say nothing about theirs (hpo.devices, when set, pins them all the same).
    visible = visible_gpus() if runs_here(config) else []
    plan = plan_fleet(ask, visible)
    check_ranked_trials(ask.gpus_per_trial, s)
    if not plan.is_fleet or fleet_worker():
        return None
    if s.budget.per_run:
        raise SweepConfigError(
            f"hpo.workers={plan.workers} needs a study-wide budget, but {s.budget.key}="
            f"{s.budget.n_trials} counts the trials of each run (each worker would run that "
            "many); allowed: hpo.n_trials, the study's total"
        )
    if not s.storage.persistent:
        raise SweepConfigError(
            f"hpo.workers={plan.workers} needs a study the workers share, but "
            f"{s.storage.key} keeps it in this process's memory; allowed: a journal file "
            "(one node) or a database URL (a cluster)"
        )
    if runs_here(config):  # a launcher's nodes: each worker finds its own GPU's memory
        check_shared_gpus(plan, ask, config.get("gpu"))
    return Fleet(plan, config, make_job)


def check_ranked_trials(k: int, s: SweepSettings) -> None:
    """What a trial of k > 1 ranks cannot do, as one line before any trial starts."""
    if k <= 1:
        return
    if not s.storage.persistent:  # rank 0 is a process of its own: it must reach the study
        raise SweepConfigError(
            f"hpo.gpus_per_trial={k} needs a study its ranks reach, but hpo.storage keeps it "
            "in this process's memory; allowed: a journal file (one node) or a database URL"
        )
