"""The sweep loop of one worker: ask a batch -> launch its jobs -> tell, until the budget is spent.

A batch is `n_jobs` trials handed to the configured Hydra launcher in one `launch()` call; the
next batch is asked when the whole batch has ended (Hydra's launcher API returns per call).
Several worker processes on one storage share a study with no barrier among them.

SIGTERM or SIGINT between trials, or a trial whose job was preempted, stops the worker after
it recorded its trials: a preempted trial is re-queued with its parameters (and
`training.resume=<its run dir>`), and rerunning the command resumes the study.
"""

from __future__ import annotations

import gc
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import optuna
from hydra.plugins.launcher import Launcher
from omegaconf import DictConfig
from optuna.trial import Trial, TrialState

from app.core.preemption import StopRequest, stop_on_signals

from .. import _private as private
from .. import reporter
from .._errors import SweepAborted, first_line
from .._fleet._gpu_share import GpuShare, gpu_sharing
from .._pruners._asha import PAUSED
from .._pruners._companion import Judge
from .._report._results import HParamsWriter, write_results
from .._study._cost import COST, line_cost
from .._study._fleet_plan import WorkerIdentity
from .._study._samplers import record_oom_constraint
from .._study._settings import SweepSettings
from .._study._shared import TrialBudget, budget_lock, heartbeat, requeue
from .._study._space import SearchSpace, SpaceHook, format_value, largest_point, suggest
from .._study._storage import Masker, retrying
from .._study._warm_start import Borrowed, apply_warm_start
from ._outcomes import Outcome, classify, error_attrs, not_started

log = logging.getLogger(__name__)
REPORTER = "hydra_plugins.hydratrain_optuna_sweeper.reporter.reporter_for_job"
CAP_KEY = "memory_limit_gib"  # gpu.memory_limit_gib: the memory a trial's process may take
BETWEEN_TRIALS = "finishing the trials of this batch, then stopping (send it again to stop at once)"
# At the end of the budget a worker waiting for another worker's trial looks this often at
# most: a fleet ends with its last worker, up to one look after its last trial ended.
END_LOOK = 0.1  # a read of the study: cheap beside a trial


@dataclass
class Plan:
    """Everything a worker needs, decided before its first trial."""

    settings: SweepSettings
    study: optuna.Study
    budget: TrialBudget
    space: SearchSpace
    hook: SpaceHook | None
    config: DictConfig  # the sweep's (master) config, handed to the search-space hook
    launcher: Launcher
    sweep_dir: str
    job_storage: str  # hpo.storage as jobs get it (never a password)
    mask: Masker
    constraints: bool  # mark out-of-memory trials infeasible, for the sampler
    judge: Judge | None = None  # where trials report (several objectives: the companion)
    warm: Borrowed | None = None  # hpo.warm_start: what this study takes from earlier ones

    def write_results(self, final: bool = False) -> Path:
        """optimization_results.yaml: after each trial; the study's analyses
        (hpo.batch_size_study) only at the end."""
        s = self.settings
        batch_study = s.batch_size_study if final else None
        return write_results(
            self.study, self.mask(s.storage.text), s.metrics, self.sweep_dir, batch_study
        )


class Worker:
    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.s = plan.settings
        self.study = plan.study
        self.stop = StopRequest()
        self.hparams = HParamsWriter(plan.sweep_dir) if self.s.tensorboard else None
        self.finished = 0
        self.failed = 0
        self.identity = WorkerIdentity.here().attrs()  # recorded on each trial it runs
        self.judge = plan.judge or Judge(plan.study)
        s = plan.settings  # hpo.trials_per_gpu=auto: a seat on the GPU before each batch
        self.sharing = gpu_sharing(
            s.fleet, plan.config.get("gpu"), plan.sweep_dir, plan.study, s.liveness.poll_interval
        )

    def run(self) -> int:
        """Run trials until the budget is spent; 0, or 128 + the signal that stopped it."""
        with stop_on_signals(self.stop, then=BETWEEN_TRIALS):
            self._enqueue_initial()
            try:
                while not self.stop.requested and self._next_batch():
                    pass
            finally:
                if self.hparams is not None:
                    self.hparams.close()
                path = self.plan.write_results(final=True)
                log.info("Results in %s", path)
        return self.stop.exit_status if self.stop.requested else 0

    def _enqueue_initial(self) -> None:
        """hpo.enqueue: parameter sets to try first, queued once when the study is new. Where
        trials share GPUs by measured memory (hpo.trials_per_gpu=auto) and none is given, the
        first is the search space's largest point: its peak bounds the rest."""
        first: list[dict[str, object]] = [dict(p) for p in self.s.enqueue]
        if not first and self.sharing is not None:
            first = [dict(largest_point(self.plan.space.distributions))]
        lock = self.s.storage.lock_path
        if any(first):
            with budget_lock(lock):
                if not self.study.get_trials(deepcopy=False):
                    for params in first:
                        self.study.enqueue_trial(params)
        warm = self.plan.warm  # after hpo.enqueue's, once per study (a rerun borrows nothing)
        if warm is not None and apply_warm_start(self.study, warm, lock):
            log.info("%s: done", warm.describe())

    def _next_batch(self) -> bool:
        """Run the next batch of trials, in a seat of its GPU where trials share it; False
        when there is none (the budget is spent, or the worker was stopped)."""
        if self.sharing is None:
            trials = self._next_trials()
            if trials:
                self._run_batch(trials)
            return bool(trials)
        with self.sharing.seat(self.stop) as share:
            trials = self._next_trials() if share is not None else []
            if trials:
                assert share is not None
                self.sharing.started(trials[0].number)
                log.info("Trial %d: %s", trials[0].number, share.describe())
                self._run_batch(trials, share)
            return bool(trials)

    def _next_trials(self) -> list[Trial]:
        """The next batch; at the end of a study-wide budget, wait for other workers' running
        trials (failing them if they go stale) so the results describe the whole study."""
        budget = self.plan.budget
        while True:
            trials = budget.next_trials(self.s.n_jobs)
            if trials or self.stop.requested:
                return trials
            if self.s.liveness.wait_for_running and budget.others_running():
                time.sleep(min(self.s.liveness.poll_interval, END_LOOK))
            elif not budget.promote_at_end():
                return trials

    def _run_batch(self, trials: list[Trial], share: GpuShare | None = None) -> None:
        jobs = []
        for trial in trials:
            try:
                jobs.append((trial, self._overrides(trial, share)))
            except Exception as e:  # a broken search-space hook fails this trial only
                self._tell(trial, Outcome(TrialState.FAIL, attrs=error_attrs("error", e)))
        outcomes = self._launch(jobs, share)
        rss = release_memory()
        for (trial, _), outcome in zip(jobs, outcomes, strict=True):
            outcome.attrs["host_rss_bytes"] = rss
            self._tell(trial, outcome)
        self._check_failures(outcomes)

    def _launch(
        self, jobs: list[tuple[Trial, list[str]]], share: GpuShare | None = None
    ) -> list[Outcome]:
        p = self.plan
        if not jobs:
            return []
        trials = [t for t, _ in jobs]
        shared = share.attrs() if share is not None else {}
        for trial in trials:
            # before it runs: a fleet finds orphans, and sees how a GPU is shared
            for key, value in {**self.identity, **shared}.items():
                trial.set_user_attr(key, value)
            twin = self.judge.pair(trial)
            reporter.register_live_trial(p.job_storage, self.study.study_name, trial, twin)
        try:
            with heartbeat(self.study, trials, self.s.liveness.heartbeat_interval):
                outcomes: list[Outcome] = []
                for group in consecutive(jobs):  # job number = trial number: its run dir
                    if self.stop.requested:  # a stop launches nothing after it
                        outcomes += [not_started(self.stop.signum) for _ in group]
                        continue
                    overrides = [o for _, o in group]
                    returns = p.launcher.launch(overrides, initial_job_idx=group[0][0].number)
                    n, signum = len(self.s.directions), self.stop.signum
                    outcomes += [classify(ret, n, stopped_by=signum) for ret in returns]
                    del returns  # a failed job's traceback pins its model: drop it now
            return outcomes
        except Exception as e:  # the launcher itself failed
            return [Outcome(TrialState.FAIL, attrs=error_attrs("error", e)) for _ in jobs]
        finally:
            for trial in trials:
                reporter.unregister_live_trial(p.job_storage, self.study.study_name, trial.number)

    def _overrides(self, trial: Trial, share: GpuShare | None = None) -> list[str]:
        p = self.plan
        for name, dist in p.space.distributions.items():
            suggest(trial, name, dist)
        extra = dict(p.hook(p.config, trial) or {}) if p.hook else {}
        chosen = {**trial.params, **extra}
        for key, text in p.space.fixed.items():  # as stock: fixed values as user attrs
            if key not in chosen:
                trial.set_user_attr(key, p.mask(text))
        resume = trial.user_attrs.get("resume_from")
        return [
            *(p.space.override(k, v) for k, v in chosen.items()),
            *p.space.fixed_overrides(exclude={**chosen, **self._job_keys(), **self._cap(share)}),
            *p.space.deletions,
            *([f"training.resume={format_value(resume)}"] if resume else []),
            *self._job_overrides(trial),
            *(f"{k}={v}" for k, v in self._cap(share).items()),
        ]

    def _cap(self, share: GpuShare | None) -> dict[str, str]:
        """A trial that shares its GPU is held to what it reserved (the app's gpu node)."""
        gpu = self.plan.config.get("gpu")
        if share is None or gpu is None or CAP_KEY not in gpu:
            return {}
        return {f"gpu.{CAP_KEY}": format_value(share.cap_gib())}

    def _job_keys(self) -> dict[str, None]:
        keys = ("study_name", "storage", "trial_number", "reporter")
        return {f"hpo.{k}": None for k in keys} if self.s.hpo_node else {}

    def _job_overrides(self, trial: Trial) -> list[str]:
        """What a job needs to find its trial: in its hpo node, or for an app without one (its
        config stays its own) in its environment, which Hydra sets around every job
        (`hydra.job.env_set`), in this process or any launcher's."""
        values = {
            "study_name": format_value(self.study.study_name),
            "storage": format_value(self.plan.job_storage),
            "trial_number": str(trial.number),
        }
        if not self.s.hpo_node:
            env = reporter.TRIAL_ENV
            return [f"++hydra.job.env_set.{env[k]}={v}" for k, v in values.items()]
        return [f"++hpo.{k}={v}" for k, v in {**values, "reporter": REPORTER}.items()]

    def _tell(self, trial: Trial, outcome: Outcome) -> None:
        """Record the outcome, unless another worker failed the trial as stale meanwhile."""
        try:
            with private.finished_trial_guard():
                retrying(lambda: self._record(trial, outcome), f"tell trial {trial.number}")
        except private.TrialFinished:
            self._taken_over(trial)
        else:
            if outcome.trace is not None:  # recorded as this worker's: its error is worth reading
                log.warning("Trial %d failed\n%s", trial.number, outcome.trace.rstrip())
        self.plan.budget.done(trial)

    def _record(self, trial: Trial, outcome: Outcome) -> None:
        if private.frozen(self.study, trial).state.is_finished():
            raise private.TrialFinished(f"trial {trial.number} finished")
        for key, value in outcome.attrs.items():
            trial.set_user_attr(key, value)
        if self.plan.constraints and outcome.state != TrialState.FAIL:  # read for these two
            record_oom_constraint(trial, outcome.reason == "oom")
        if outcome.preempted_by is not None:
            self._preempted(trial, outcome)
        if outcome.paused_at is not None:  # before the tell: a finished trial is frozen
            private.set_system_attr(self.study, trial, PAUSED, outcome.paused_at)
        self._cost_of_line(trial, outcome)
        self._tell_state(trial, outcome)
        self.judge.settle(trial, outcome.state)
        self.finished += 1
        self.failed += outcome.failed
        self._log(trial, outcome)

    def _cost_of_line(self, trial: Trial, outcome: Outcome) -> None:
        """The device_seconds objective of a resumed trial is its whole line's."""
        metrics = self.s.metrics or []
        if outcome.values is None or COST not in metrics:
            return
        i = metrics.index(COST)
        frozen = private.frozen(self.study, trial)
        outcome.values[i] = line_cost(self.study, frozen, outcome.values[i])

    def _tell_state(self, trial: Trial, outcome: Outcome) -> None:
        values = outcome.values or []
        try:
            if outcome.state == TrialState.COMPLETE:
                self.study.tell(trial, values[0] if len(values) == 1 else values)
            else:
                self.study.tell(trial, state=outcome.state)
        except RuntimeError as e:
            # GridSampler calls Study.stop() once the grid is done, which only works inside
            # optimize(); the trial is told by then (as the stock sweeper does, go on).
            if "Study.stop" not in str(e):
                raise

    def _preempted(self, trial: Trial, outcome: Outcome) -> None:
        """Not counted; its parameters are queued again, to resume from its checkpoint."""
        self.plan.budget.release(trial)
        run_dir = outcome.attrs.get("run_dir")
        requeue(
            self.study,
            private.frozen(self.study, trial),
            {"resume_from": run_dir} if run_dir else None,
        )
        self.stop.signum = self.stop.signum or outcome.preempted_by

    def _taken_over(self, trial: Trial) -> None:
        frozen = private.frozen(self.study, trial)
        log.warning(
            "Trial %d was %s by another worker (%s) while this worker was away; "
            "its result is dropped and the sweep goes on",
            trial.number,
            frozen.state.name,
            frozen.user_attrs.get("reason", "no reason given"),
        )

    def _log(self, trial: Trial, outcome: Outcome) -> None:
        frozen = private.frozen(self.study, trial)
        log.info(
            "Trial %d %s %s %s",
            trial.number,
            frozen.state.name,
            frozen.values or "",
            outcome.reason,
        )
        if self.hparams is not None:
            self.hparams.write(frozen, self.s.metrics)
        self.plan.write_results()

    def _check_failures(self, outcomes: list[Outcome]) -> None:
        rule = self.s.failure
        if rule.per_batch:  # stock: the FAIL share of this batch
            failed = [o for o in outcomes if o.failed]
            n, total = len(failed), len(outcomes)
        else:  # ours: of this worker's trials, once it finished a few
            failed, n, total = [], self.failed, self.finished
            if total < rule.min_trials:
                return
        if total and n / total > rule.max_rate:
            last = (
                f" (last: {first_line(str(failed[-1].attrs.get('error', '')))})" if failed else ""
            )
            raise SweepAborted(
                f"{n} of {total} trials failed{last}, more than {rule.key}={rule.max_rate}: "
                "sweep stopped"
            )


def consecutive(jobs: list[tuple[Trial, list[str]]]) -> list[list[tuple[Trial, list[str]]]]:
    """Runs of jobs whose trial numbers follow each other (a launch numbers its jobs so)."""
    groups: list[list[tuple[Trial, list[str]]]] = []
    for job in jobs:
        if groups and groups[-1][-1][0].number + 1 == job[0].number:
            groups[-1].append(job)
        else:
            groups.append([job])
    return groups


def release_memory() -> int:
    """Free what the last in-process trials left behind; return this process's RSS in bytes.

    A full collection walks every object of torch and transformers (~0.15 s a trial, a tenth
    of a short CPU trial): only where device memory is at stake. Elsewhere the young
    generations are collected, and Python's own full collections take the rest."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()
    else:
        gc.collect(1)
    return _rss_bytes()


def _rss_bytes() -> int:
    try:
        import os

        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
