"""Planning a sweep: everything that can be wrong is checked before the study is touched.

Order: settings -> the fleet (hpo.workers: its local workers start here, each checking the
rest itself, so their start-up runs beside this process's) -> search space -> every searched
value through the app's validation -> metrics -> sampler and pruner -> storage -> study. A bad
setting ends in one `error:` line and exit status 2 with the storage byte for byte as it was
(a fleet's workers, started, stop at the same setting; the parent waits for them). Then
`_worker.Worker` runs the trials, or the fleet does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import optuna
from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, read_write
from optuna.samplers import CmaEsSampler

from app.config.budget import BudgetUnit

from .._errors import NoTrialCompleted, StorageUnreachable, SweepAborted, SweepConfigError
from .._fleet._jobs import FleetJob, worker_config
from .._pruners._companion import Judge, open_companion
from .._pruners._kind import (
    ReportAxis,
    build_pruner,
    check_declared,
    pruner_kind,
    record_pruner_args,
    schedule_of,
    study_pruner_args,
)
from .._pruners._learned import current
from .._pruners._line_sampler import LineSampler, unwrapped
from .._report._records import describe, write_sweep_report
from .._report._results import check_completed
from .._study._checks import check_objectives, check_space
from .._study._cost import CostCap, TrialsWorth, budget_text, record_budget
from .._study._fleet_plan import FleetPlan, fleet_worker, seeded_for_worker
from .._study._samplers import build_sampler, grid_size
from .._study._settings import SweepSettings, read_settings
from .._study._shared import RunTrialBudget, StudyTrialBudget
from .._study._space import (
    Entry,
    SearchSpace,
    legacy_entries,
    load_hook,
    params_entries,
    parse_space,
)
from .._study._stock import StockOptions
from .._study._storage import Masker, job_storage, open_storage, passwords
from .._study._warm_start import warm_start_for
from ._fleet_run import Fleet, plan_fleet_of
from ._outcomes import StartUnlessStopped, signal_name
from ._transfer import check_study, plan_transfer, record_transfer, run_target
from ._worker import Plan, Worker

log = logging.getLogger(__name__)
# Optuna marks some samplers experimental; that notice is not the user's business here.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


class OptunaSweeperImpl(Sweeper):
    def __init__(self, options: Mapping[str, object], stock_node: bool) -> None:
        self.options = dict(options)
        self.stock_node = stock_node
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.launcher: Launcher | None = None
        self.task_function: TaskFunction | None = None
        self.fleet: Fleet | None = None  # set by sweep when hpo.workers starts workers here
        self.mask = Masker()  # every password the sweep holds, once its settings are read

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context,
            task_function=StartUnlessStopped(task_function),
            config=config,
        )

    def sweep(self, arguments: list[str]) -> None:
        try:
            s = self._settings()
            with self._start_fleet(s, arguments):
                plan = self._plan(s, arguments)
                try:
                    status = self.fleet.run(plan) if self.fleet else Worker(plan).run()
                    if run_target(plan.study, s, plan.launcher, plan.sweep_dir, status):
                        plan.write_results(final=True)  # with the target run
                finally:  # a stopped or failed sweep too: the report shows what the study holds
                    self._report(plan)
            if not status:  # a stopped worker's status says more than its study's state
                check_completed(plan.study)
        except SweepConfigError as e:
            # SystemExit passes through Hydra's error report, which would add a second line:
            # a bad sweep setting ends like a bad training setting, one line and status 2.
            print(f"error: {e}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        except (StorageUnreachable, SweepAborted, NoTrialCompleted) as e:  # status 1
            print(f"error: {self.mask(str(e))}", file=sys.stderr, flush=True)
            raise SystemExit(1) from None
        if fleet_worker():
            # A fleet's worker ends with its sweep, and the fleet's parent waits for that end:
            # the interpreter's last garbage collection would walk every object torch and
            # transformers made (about a second on a CPU) to free what the exit frees anyway.
            gc.freeze()
        if status:
            if not self.fleet:  # a fleet said why, for each of its workers
                print(
                    f"stopped: {signal_name(status)}: the worker recorded its trials and "
                    "stopped; rerun the same command to resume the study",
                    file=sys.stderr,
                    flush=True,
                )
            raise SystemExit(status)

    def _settings(self) -> SweepSettings:
        assert self.config is not None
        stock = StockOptions.of(self.options, self.stock_node)
        s = read_settings(stock, self.config.get("hpo"), str(self.config.hydra.sweep.dir))
        self.mask = _masker(self.config, s)
        return s

    def _start_fleet(
        self, s: SweepSettings, arguments: list[str]
    ) -> contextlib.AbstractContextManager[None]:
        """The fleet hpo.workers asks for, checked (`self.fleet`; None: a lone worker). One of
        this node's processes starts its workers now, before the study is prepared: each is a
        sweep process of its own, whose start-up (imports, composing and checking the config)
        then runs beside this process's checks rather than after them."""
        assert self.config is not None
        self.fleet = plan_fleet_of(s, self.config, lambda fleet: self._fleet_job(fleet, arguments))
        if self.fleet is None:
            return contextlib.nullcontext()
        sweep_dir = str(self.config.hydra.sweep.dir)
        return self.fleet.started(s, sweep_dir, self.mask(s.storage.text))

    def _plan(self, s: SweepSettings, arguments: list[str]) -> Plan:
        assert self.config is not None and self.launcher is not None
        sweep_dir = str(self.config.hydra.sweep.dir)
        space = _space(s, arguments)
        hook = load_hook(s.search_space_fn, s.search_space_key)
        job_cfg = check_space(self._compose, space, str(self.config.hydra.job.config_name))
        check_objectives(job_cfg, s)
        plan_transfer(s, job_cfg, self._compose, space, str(self.config.hydra.job.config_name))
        sampler = _sampler(s, space)
        schedule = schedule_of(job_cfg)
        check_declared(job_cfg.get("hpo"), schedule)
        _check_batch_study(s, schedule)
        pruner_args = study_pruner_args(s.pruner, s.pruner_args, s.budget.worth, schedule)
        pruner = build_pruner(s.pruner, pruner_args, len(s.directions), schedule)
        judged_by = build_pruner(s.pruner, pruner_args, 1, schedule)  # the report metric's
        log.info(
            "Study %s in %s: %s, sampler %s, pruner %s%s",
            s.study_name or "(a new one)",
            self.mask(s.storage.text),
            budget_text(s.budget, s.budget_s, schedule),
            type(unwrapped(sampler)).__name__,
            type(current(judged_by if _has_companion(s) else pruner)).__name__,
            _axis_text(schedule, space),
        )
        # CmaEsSampler ignores constraints, and warns about each trial that has one.
        constraints = s.hpo_node and not isinstance(unwrapped(sampler), CmaEsSampler)
        warm = warm_start_for(s, space.distributions, schedule, constraints, self.mask)
        study = self._open_study(s, sampler, pruner)
        record_pruner_args(study, pruner_args)
        if schedule is not None:
            describe(study, s.metrics, schedule.unit.value, schedule.last)
        judge = _judge(study, s, judged_by)
        if not fleet_worker():  # the fleet's parent wrote it
            self._write_multirun_yaml(sweep_dir)
        return Plan(
            settings=s,
            study=study,
            budget=_budget(study, s, judge, schedule, space),
            space=space,
            hook=hook,
            config=self.config,
            launcher=self.launcher,
            sweep_dir=sweep_dir,
            job_storage=job_storage(s.storage, self.mask),
            mask=self.mask,
            constraints=constraints,
            judge=judge,
            warm=warm,
        )

    def _fleet_job(self, fleet: FleetPlan, arguments: list[str]) -> FleetJob:
        """What each launched worker runs: this sweeper again, from what it was made of."""
        assert self.hydra_context is not None and self.task_function is not None
        assert self.config is not None
        return FleetJob(
            sweeper_cls=type(self),
            options=dict(self.options),
            stock_node=self.stock_node,
            hydra_context=self.hydra_context,
            task_function=self.task_function,
            config=worker_config(self.hydra_context, self.config),
            arguments=list(arguments),
            envs=[fleet.env(i) for i in range(fleet.workers)],
        )

    def _report(self, plan: Plan) -> None:
        """report.html, by the fleet's parent or the lone worker (not by each of a fleet's)."""
        if fleet_worker():
            return
        path = write_sweep_report(plan.study, plan.mask(plan.settings.storage.text), plan.sweep_dir)
        if path is not None:
            log.info("Report in %s", path)

    def _compose(self, overrides: list[str]) -> DictConfig:
        assert self.hydra_context is not None and self.config is not None
        return self.hydra_context.config_loader.load_sweep_config(self.config, overrides)

    def _open_study(
        self,
        s: SweepSettings,
        sampler: optuna.samplers.BaseSampler,
        pruner: optuna.pruners.BasePruner,
    ) -> optuna.Study:
        """The study, refused where its trials ran under another parametrization; the trials'
        parametrization recorded on it."""
        check_study(s, self.mask)  # before the storage is opened: a new journal is made then
        storage = open_storage(s.storage, self.mask)
        directions: list[Literal["minimize", "maximize"]] = [
            "maximize" if d == "maximize" else "minimize" for d in s.directions
        ]
        try:
            study = optuna.create_study(
                study_name=s.study_name,
                storage=storage,
                sampler=sampler,
                pruner=pruner,
                directions=directions,
                load_if_exists=True,
            )
        except ValueError as e:  # e.g. resuming with other directions
            raise SweepConfigError(
                f"{s.direction_key}={directions} does not fit study {s.study_name!r}: {e}"
            ) from None
        have = [d.name.lower() for d in study.directions]
        if have != directions:
            raise SweepConfigError(
                f"{s.direction_key}={directions} but study {s.study_name!r} has {have}"
            )
        record_transfer(study, s)
        return study

    def _write_multirun_yaml(self, sweep_dir: str) -> None:
        """The sweep's config, masked. The jobs' own .hydra/ files are composed from the
        hydra.* overrides, so a password given there is masked before any job starts."""
        assert self.config is not None
        overrides = self.config.hydra.overrides
        with read_write(overrides):
            for kind in ("hydra", "task"):
                overrides[kind] = [self.mask(str(o)) for o in overrides[kind]]
        Path(sweep_dir).mkdir(parents=True, exist_ok=True)
        text = self.mask(OmegaConf.to_yaml(self.config))
        Path(sweep_dir, "multirun.yaml").write_text(text)


def _sampler(s: SweepSettings, space: SearchSpace) -> optuna.samplers.BaseSampler:
    sampler = build_sampler(
        seeded_for_worker(s.sampler), s.sampler_key, space.grid, len(s.directions), s.hpo_node
    )
    if isinstance(sampler, optuna.samplers.GridSampler):  # as stock: at most the grid
        _cap_to_grid(s, grid_size(space.grid()))
    if pruner_kind(s.pruner).pauses:  # a paused trial and its promotion are one observation
        return LineSampler(sampler)
    return sampler


def _has_companion(s: SweepSettings) -> bool:
    """Several objectives with a pruner: a companion study judges hpo.report_metric."""
    return s.multi_objective and s.hpo_node and pruner_kind(s.pruner).judges


def _judge(study: optuna.Study, s: SweepSettings, pruner: optuna.pruners.BasePruner) -> Judge:
    if not _has_companion(s):
        return Judge(study)
    assert s.report_metric is not None
    companion = open_companion(study, s.report_metric, s.report_direction, pruner)
    return Judge(study, companion)


def _budget(
    study: optuna.Study,
    s: SweepSettings,
    judge: Judge,
    schedule: ReportAxis | None,
    space: SearchSpace,
) -> RunTrialBudget | StudyTrialBudget:
    promotes = pruner_kind(s.pruner).promoter
    promoter = promotes(study, judge.study) if promotes is not None else None
    cost = CostCap(study, s.budget_s) if s.budget_s is not None else None
    b = s.budget
    worth = None
    if b.worth is not None:
        worth = TrialsWorth(judge.study, b.worth, schedule)
        record_budget(study, b.worth)
    cls = RunTrialBudget if b.per_run else StudyTrialBudget
    return cls(
        study,
        b.n_trials,
        s.storage.lock_path,
        s.liveness,
        promoter=promoter,
        cost=cost,
        worth=worth,
        draw=space.draw,
    )


def _space(s: SweepSettings, arguments: list[str]) -> SearchSpace:
    entries: list[Entry] = []
    if s.search_space is not None:
        entries += legacy_entries(s.search_space, "hydra.sweeper.search_space")
    for mapping, prefix in s.space_sources:
        entries += params_entries(mapping, prefix)
    entries += [Entry.argument(a) for a in arguments]
    return parse_space(entries)


def _masker(config: DictConfig, s: SweepSettings) -> Masker:
    """Every password the sweep's config or its storage setting holds."""
    texts = [s.storage.text, OmegaConf.to_yaml(config)]
    # Something only a job can resolve stays unresolved: the unresolved text still counts.
    with contextlib.suppress(Exception):
        texts.append(OmegaConf.to_yaml(config, resolve=True))
    return Masker(frozenset().union(*(passwords(t) for t in texts)))


def _cap_to_grid(s: SweepSettings, size: int) -> None:
    """As stock, at most the grid: a budget in worth is capped to the grid's count too."""
    if s.budget.n_trials is None or size < s.budget.n_trials:
        log.info("Updating num of trials to %d due to using GridSampler.", size)
        s.budget = dataclasses.replace(s.budget, n_trials=size)


BATCH_KEY = "training.effective_batch_size"


def _axis_text(schedule: ReportAxis | None, space: SearchSpace) -> str:
    """Where trials report, so a user knows which unit the pruner's rungs are in, and on which
    axis trials of a searched batch size are compared: equal data, or (a budget in steps)
    equal steps, where a larger batch has seen more data."""
    if schedule is None:
        return ""
    axis = f"; trials report every {schedule.every:,} {schedule.unit} up to {schedule.last:,}"
    if BATCH_KEY not in space.distributions:
        return axis
    if schedule.unit is not BudgetUnit.STEPS:
        return f"{axis}: every batch size is compared at equal data"
    return (
        f"{axis}: trials are compared at equal steps, so a larger {BATCH_KEY} has seen more "
        f"data (a budget in steps: training.max_steps={schedule.last})"
    )


def _check_batch_study(s: SweepSettings, schedule: ReportAxis | None) -> None:
    """The batch-size study reads its trials' curves as samples seen."""
    if s.batch_size_study is None or (schedule is not None and schedule.unit is BudgetUnit.SAMPLES):
        return
    unit = "no training budget" if schedule is None else f"a budget in {schedule.unit}"
    raise SweepConfigError(
        f"hpo.batch_size_study compares batches at equal samples, but the job has {unit}; set "
        "training.max_samples (and training.max_steps=null, training.max_tokens=null)"
    )
