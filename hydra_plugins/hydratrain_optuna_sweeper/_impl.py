"""The sweep loop: ask -> launch one job -> tell, until the study-wide budget is spent.

Each worker runs one trial at a time and asks for the next as soon as the last one ends, so
several workers (processes running the same command) share a study with no batch barrier.
"""

from __future__ import annotations

import gc
import logging
import math
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import CompactHydraException
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import TrialState

from . import reporter
from ._results import HParamsWriter, write_results
from ._settings import (
    HpoSettings,
    SweepConfigError,
    build_pruner,
    build_sampler,
    read_settings,
    record_oom_constraint,
)
from ._space import format_value, load_hook, parse_space, suggest
from ._study import Budget, heartbeat, open_storage, resolve_storage

log = logging.getLogger(__name__)

STOCK_KEYS = (
    "sampler",
    "direction",
    "study_name",
    "storage",
    "n_trials",
    "n_jobs",
    "max_failure_rate",
    "custom_search_space",
)


class SweepAborted(CompactHydraException):
    """Too many failed trials: the sweep stops (exit code 1) with one line saying why."""


@dataclass
class Outcome:
    state: TrialState
    values: list[float] | None = None
    attrs: dict[str, Any] = field(default_factory=dict)


class OptunaSweeperImpl(Sweeper):
    def __init__(self, options: dict[str, Any]) -> None:
        self.params: dict[str, Any] = dict(options.get("params") or {})
        self.stock = {k: options.get(k) for k in STOCK_KEYS}
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.launcher: Any = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    # -- planning: everything that can be wrong is checked here, before any trial exists --

    def sweep(self, arguments: list[str]) -> None:
        try:
            self._sweep(arguments)
        except SweepConfigError as e:
            # SystemExit passes through Hydra's error report, which would add a second line:
            # a bad sweep setting ends like a bad training setting, one line and status 2.
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2) from None

    def _sweep(self, arguments: list[str]) -> None:
        assert self.config is not None
        s = read_settings(self.config.get("hpo"), self.stock)
        if (self.stock.get("n_jobs") or 1) > 1:
            log.warning("n_jobs is ignored: run several workers (processes) for parallel trials")
        entries = [(f"hydra.sweeper.params.{k}", f"{k}={v}") for k, v in self.params.items()]
        entries += [(f"command-line override {a!r}", a) for a in arguments]
        space, fixed = parse_space(entries)
        hook = load_hook(s.search_space_fn)
        self._check_composes(space, fixed)
        sampler, pruner = build_sampler(s), build_pruner(s)
        sweep_dir = str(self.config.hydra.sweep.dir)
        storage = resolve_storage(s.storage, sweep_dir)
        study = self._open_study(s, storage, sampler, pruner)
        Path(sweep_dir).mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, Path(sweep_dir, "multirun.yaml"))
        log.info(
            "Study %s in %s: %d trials, sampler %s, pruner %s",
            s.study_name,
            storage,
            s.n_trials,
            type(sampler).__name__,
            type(pruner).__name__,
        )
        _Worker(self, s, study, storage, space, fixed, hook, sweep_dir).run()

    def _check_composes(self, space: dict[str, BaseDistribution], fixed: dict[str, str]) -> None:
        """Compose one job config up front so a misspelled key fails before trial 0."""
        probe = list(fixed.values()) + [
            f"{k}={format_value(_sample_value(d))}" for k, d in space.items()
        ]
        try:
            self.validate_batch_is_legal([probe])
        except Exception as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise SweepConfigError(
                f"hydra.sweeper.params / overrides do not compose: {first}"
            ) from None

    def _open_study(self, s: HpoSettings, storage: str, sampler: Any, pruner: Any) -> optuna.Study:
        store = open_storage(storage)
        try:
            study = optuna.create_study(
                study_name=s.study_name,
                storage=store,
                sampler=sampler,
                pruner=pruner,
                directions=s.directions,
                load_if_exists=True,
            )
        except ValueError as e:  # e.g. resuming with other directions
            raise SweepConfigError(
                f"hpo.direction={s.directions} does not fit study {s.study_name!r}: {e}"
            ) from None
        wanted = [optuna.study.StudyDirection[d.upper()] for d in s.directions]
        if list(study.directions) != wanted:
            have = [d.name.lower() for d in study.directions]
            raise SweepConfigError(
                f"hpo.direction={s.directions} but study {s.study_name!r} has {have}"
            )
        return study


def _sample_value(dist: BaseDistribution) -> Any:
    if isinstance(dist, CategoricalDistribution):
        return dist.choices[0]
    return dist.to_external_repr(dist.low)  # type: ignore[attr-defined]


class _Worker:
    """One process's share of the study."""

    def __init__(
        self,
        sweeper: OptunaSweeperImpl,
        s: HpoSettings,
        study: optuna.Study,
        storage: str,
        space: dict[str, BaseDistribution],
        fixed: dict[str, str],
        hook: Any,
        sweep_dir: str,
    ) -> None:
        self.sweeper, self.s, self.study, self.storage = sweeper, s, study, storage
        self.space, self.fixed, self.hook, self.sweep_dir = space, fixed, hook, sweep_dir
        self.budget = Budget(study, s, storage)
        self.hparams = HParamsWriter(sweep_dir) if s.tensorboard else None
        self.finished = 0
        self.failed = 0

    def run(self) -> None:
        self._enqueue_initial()
        try:
            while (trial := self._next()) is not None:
                self._run_trial(trial)
                self._check_failure_rate()
        finally:
            if self.hparams is not None:
                self.hparams.close()
            path = write_results(self.study, self.storage, self.s.metrics, self.sweep_dir)
            log.info("Results in %s", path)

    def _enqueue_initial(self) -> None:
        """hpo.enqueue: parameter sets to try first, queued once when the study is new."""
        from ._study import budget_lock

        if not self.s.enqueue:
            return
        with budget_lock(self.storage):
            if self.study.get_trials(deepcopy=False):
                return
            for params in self.s.enqueue:
                self.study.enqueue_trial(dict(params), skip_if_exists=True)

    def _next(self) -> optuna.trial.Trial | None:
        """The next trial; when the budget is spent, wait for other workers' running trials
        (failing them if they go stale) so the results file describes the whole study."""
        while True:
            trial = self.budget.next_trial()
            if trial is not None or not (self.s.wait_for_running and self.budget.others_running()):
                return trial
            import time

            time.sleep(self.s.poll_interval)

    def _overrides(self, trial: optuna.trial.Trial) -> list[str]:
        for name, dist in self.space.items():
            suggest(trial, name, dist)
        extra = dict(self.hook(self.sweeper.config, trial) or {}) if self.hook else {}
        chosen = {**trial.params, **extra}
        fixed = [text for key, text in self.fixed.items() if key not in chosen]
        hpo = {
            "study_name": self.s.study_name,
            "storage": self.storage,
            "trial_number": trial.number,
        }
        return (
            fixed
            + [f"{k}={format_value(v)}" for k, v in chosen.items()]
            + [f"++hpo.{k}={format_value(v)}" for k, v in hpo.items()]
        )

    def _run_trial(self, trial: optuna.trial.Trial) -> None:
        try:
            overrides = self._overrides(trial)
        except Exception as e:  # a broken search-space hook fails this trial only
            self._tell(trial, Outcome(TrialState.FAIL, attrs=_error_attrs("error", e)))
            return
        reporter.register_live_trial(self.storage, self.s.study_name, trial)
        try:
            with heartbeat(self.study, trial._trial_id, self.s.heartbeat_interval):
                ret = self.sweeper.launcher.launch([overrides], initial_job_idx=trial.number)[0]
            outcome = classify(ret, len(self.s.directions), self.s.metrics)
            del ret  # a failed job's traceback pins the model; drop it before the next trial
        except Exception as e:  # the launcher itself failed
            outcome = Outcome(TrialState.FAIL, attrs=_error_attrs("error", e))
        finally:
            reporter.unregister_live_trial(self.storage, self.s.study_name, trial.number)
        outcome.attrs["host_rss_bytes"] = release_memory()
        self._tell(trial, outcome)

    def _tell(self, trial: optuna.trial.Trial, outcome: Outcome) -> None:
        for key, value in outcome.attrs.items():
            trial.set_user_attr(key, value)
        if outcome.state != TrialState.FAIL:  # samplers read constraints of these two states
            record_oom_constraint(trial, outcome.attrs.get("reason") == "oom")
        if outcome.state == TrialState.COMPLETE:
            values = outcome.values or []
            self.study.tell(trial, values[0] if len(values) == 1 else values)
        else:
            self.study.tell(trial, state=outcome.state)
        self.budget.done(trial)
        self.finished += 1
        self.failed += outcome.state == TrialState.FAIL
        frozen = self.study._storage.get_trial(trial._trial_id)
        log.info(
            "Trial %d %s %s %s",
            trial.number,
            frozen.state.name,
            frozen.values or "",
            outcome.attrs.get("reason", ""),
        )
        if self.hparams is not None:
            self.hparams.write(frozen, self.s.metrics)
        write_results(self.study, self.storage, self.s.metrics, self.sweep_dir)

    def _check_failure_rate(self) -> None:
        if self.finished < self.s.min_trials_for_failure_rate:
            return
        rate = self.failed / self.finished
        if rate > self.s.max_failure_rate:
            raise SweepAborted(
                f"{self.failed} of {self.finished} trials failed, more than "
                f"hpo.max_failure_rate={self.s.max_failure_rate}: sweep stopped"
            )


# -- outcomes --------------------------------------------------------------------------------

OOM_NAMES = {"TrainingOOM", "OutOfMemoryError"}
PRUNED_NAMES = {"Pruned", "TrialPruned"}


def classify(ret: JobReturn, n_objectives: int, metrics: list[str]) -> Outcome:
    """Map a job's return (value or exception) to an Optuna state and user attrs."""
    attrs: dict[str, Any] = {}
    run_dir = _run_dir(ret)
    if run_dir:
        attrs["run_dir"] = run_dir
    if ret.status != JobStatus.COMPLETED:
        outcome = _from_exception(ret._return_value)
    else:
        outcome = _from_value(ret._return_value, n_objectives, metrics, run_dir)
    outcome.attrs = {**attrs, **outcome.attrs}
    return outcome


def _from_exception(exc: BaseException) -> Outcome:
    names = {c.__name__ for c in type(exc).__mro__}
    if names & OOM_NAMES:
        return Outcome(TrialState.PRUNED, attrs=_error_attrs("oom", exc))
    if names & PRUNED_NAMES:
        return Outcome(TrialState.PRUNED, attrs={"reason": "pruned"})
    if "Diverged" in names:
        return Outcome(TrialState.FAIL, attrs=_error_attrs("diverged", exc))
    log.warning("Trial failed", exc_info=(type(exc), exc, exc.__traceback__))
    return Outcome(TrialState.FAIL, attrs=_error_attrs("error", exc))


def _error_attrs(reason: str, exc: BaseException) -> dict[str, Any]:
    return {"reason": reason, "error": f"{type(exc).__name__}: {exc}"[:2000]}


def _from_value(value: Any, n: int, metrics: list[str], run_dir: str | None) -> Outcome:
    values = _as_floats(value)
    if values is None or len(values) != n:
        # e.g. a scalar `objective` with several hpo.metric: read them from the run's summary.
        values = _from_summary(run_dir, metrics)
    if values is None or len(values) != n:
        error = f"objective returned {value!r}; expected {n} float(s) for hpo.metric={metrics}"
        return Outcome(TrialState.FAIL, attrs={"reason": "error", "error": error})
    if not all(math.isfinite(v) for v in values):
        return Outcome(
            TrialState.FAIL, attrs={"reason": "diverged", "error": f"objective {values}"}
        )
    return Outcome(TrialState.COMPLETE, values=values)


def _as_floats(value: Any) -> list[float] | None:
    try:
        if isinstance(value, list | tuple):
            return [float(v) for v in value]
        return [float(value)]
    except (TypeError, ValueError):
        return None


def _from_summary(run_dir: str | None, metrics: list[str]) -> list[float] | None:
    import json

    path = Path(run_dir or "", "summary.json")
    if not run_dir or not path.is_file():
        return None
    summary = json.loads(path.read_text())
    got = [summary.get(m) for m in metrics]
    return None if any(v is None for v in got) else [float(v) for v in got]


def _run_dir(ret: JobReturn) -> str | None:
    try:
        return str(Path(ret.hydra_cfg.hydra.runtime.output_dir).absolute())  # type: ignore[union-attr]
    except Exception:
        return None


def release_memory() -> int:
    """Free what the last in-process trial left behind; return this process's RSS in bytes."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
    return _rss_bytes()


def _rss_bytes() -> int:
    try:
        import os

        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
