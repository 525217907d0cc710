"""The trial reporter a training job uses to talk to its Optuna trial.

The sweeper names this module's `reporter_for_job` in each job's `hpo.reporter`, with the
study, its storage and the trial number, so app/hpo.py (build_reporter) finds it without
importing this package. An app of one's own (any `@hydra.main` app, with no hpo node) calls
`reporter_for_job(cfg)` itself: the sweeper names its trial in the job's environment
(`TRIAL_ENV`), and the study's pruner is the default of `hpo.pruner`. When the job runs in
the sweeper's own process the live trial is taken from a registry; in another process it is
rebuilt from the storage. Imports stay light here: Hydra's plugin scan imports this module.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, TypeVar

from app.config.budget import ReportAxis
from app.config.hpo import HpoConfig
from app.core.outcomes import Paused
from app.hpo import NullReporter, Reporter, TrialAttrs

if TYPE_CHECKING:
    from optuna.trial import Trial

log = logging.getLogger(__name__)
T = TypeVar("T")

# Where a job of an app without an hpo node finds its trial: environment variables the sweeper
# sets around the job (hydra.job.env_set), by the hpo setting each stands for.
TRIAL_ENV = {
    "study_name": "HYDRATRAIN_STUDY_NAME",
    "storage": "HYDRATRAIN_STORAGE",
    "trial_number": "HYDRATRAIN_TRIAL_NUMBER",
}

# (storage, study_name, trial_number) -> (the trial, the trial its reports go to: itself, or
# its pruning companion; None: no reports), filled by the in-process sweeper.
_LIVE_TRIALS: dict[tuple[str, str, int], tuple[Trial, Trial | None]] = {}


def register_live_trial(storage: str, study_name: str, trial: Trial, judge: Trial | None) -> None:
    """`judge`: the trial its reports go to (itself, its companion), None for no reports."""
    _LIVE_TRIALS[(storage, study_name, trial.number)] = (trial, judge)


def unregister_live_trial(storage: str, study_name: str, number: int) -> None:
    _LIVE_TRIALS.pop((storage, study_name, number), None)


class OptunaReporter:
    """Reports one metric per evaluation (step = optimizer step) and asks the pruner.

    `judge` takes the reports: the trial itself, or its companion trial when the study has
    several objectives (`_companion.py`). Under hpo.pruner=asha the pruner's "stop" is a pause
    at a rung: Paused is raised, and the run checkpoints that step. A trial on several ranks
    has this reporter on rank 0 alone: the run hands its word to the others before any acts
    on it (app/engine/train/evaluation.py), so every rank pauses there and saves its part.

    A trial that another worker failed as stale (this one was paused past hpo.stale_after)
    can no longer be changed: the job then goes on without reporting, after one warning."""

    def __init__(
        self,
        trial: Trial,
        metric: str,
        can_prune: bool = True,
        judge: Trial | None = None,
        last: int | None = None,
    ) -> None:
        self.trial = trial
        self.last = last  # the schedule's end: a report there is the result, never judged
        self.judge = trial if judge is None else judge
        self.metric = metric
        self.can_prune = can_prune
        self.pauses = _pauses(self.judge)
        self._warned = False
        self._detached = False

    def report(self, step: int, metrics: dict[str, float]) -> bool:
        value = self._pick(metrics)
        if value is None or not self.can_prune or self._detached:
            return False
        if not math.isfinite(value):  # divergence is the trainer's call, not the pruner's
            return False
        stop = bool(self._call(lambda: self._report(value, step)))
        if stop and not self.pauses and self.last is not None and step >= self.last:
            return False  # as the trainer: a trial that reached its end completes with it
        if stop and self.pauses:
            raise Paused(f"paused at step {step} (hpo.pruner=asha): checkpointed", step=step)
        return stop

    def _report(self, value: float, step: int) -> bool:
        self.judge.report(value, step)
        return self.judge.should_prune()

    def _pick(self, metrics: dict[str, float]) -> float | None:
        # One name: the sweep checked hpo.report_metric against what the task reports
        # (`_checks.check_objectives`), so there is no other spelling to try.
        value = metrics.get(self.metric)
        if value is not None:
            return float(value)
        if not self._warned:
            log.warning(
                "hpo.report_metric=%s is not among reported metrics %s: no pruning",
                self.metric,
                sorted(metrics),
            )
            self._warned = True
        return None

    def set_attrs(self, attrs: TrialAttrs) -> None:
        if self._detached:
            return
        for key, value in attrs.as_dict().items():
            self._call(partial(self.trial.set_user_attr, key, _jsonable(value)))

    def _call(self, fn: Callable[[], T]) -> T | None:
        from . import _private as private
        from ._study._storage import retrying

        try:
            with private.finished_trial_guard():
                return retrying(fn, f"report to trial {self.trial.number}")
        except private.TrialFinished:
            self._detached = True
            log.warning(
                "Trial %d was finished by another worker (failed as stale while this one was "
                "away): this run goes on without reporting to it",
                self.trial.number,
            )
            return None


def _pauses(trial: Trial) -> bool:
    """The pruner pauses what it stops (`pauses`, asha's): the run saves and stops, to be
    resumed if the trial is promoted."""
    return bool(getattr(trial.study.pruner, "pauses", False))


def _jsonable(value: object) -> object:
    """A user attribute Optuna stores as JSON."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)  # paths, dtypes, devices


def reporter_for_job(cfg: object) -> Reporter:
    """The reporter for this job's trial (its hpo node names it); `cfg` is the job's config,
    typed by the app or a DictConfig."""
    from ._pruners._kind import schedule_of

    hpo = _hpo_of(cfg)
    if hpo.trial_number is None:  # not a trial
        return NullReporter()
    storage, study_name, number = str(hpo.storage), hpo.study_name, hpo.trial_number
    schedule = schedule_of(cfg)
    pair = _LIVE_TRIALS.get((storage, study_name, number))
    if pair is None:
        pair = _trial_from_storage(hpo, schedule, storage, number)
    if pair is None:
        return NullReporter()
    trial, judge = pair
    metric = hpo.report_metric or "val_loss"
    last = schedule.last if schedule is not None else None
    return OptunaReporter(trial, metric, can_prune=judge is not None, judge=judge, last=last)


def _hpo_of(cfg: object) -> HpoConfig:
    """The job's hpo node as typed by the sweeper's settings (the sweep read it so already);
    for an app without one, the defaults and the trial its environment names."""
    from omegaconf import DictConfig

    from ._study._settings import typed_hpo

    node = cfg.get("hpo") if isinstance(cfg, DictConfig) else getattr(cfg, "hpo", None)
    if isinstance(node, HpoConfig):
        return node
    if node is not None:
        return typed_hpo(node)
    named = {k: os.environ[v] for k, v in TRIAL_ENV.items() if v in os.environ}
    if "trial_number" in named:
        named["trial_number"] = int(named["trial_number"])  # type: ignore[assignment]
    return typed_hpo(named)


def _trial_from_storage(
    hpo: HpoConfig, schedule: ReportAxis | None, storage: str, number: int
) -> tuple[Trial, Trial | None] | None:
    """(the running trial, the trial its reports go to), rebuilt in this process from the
    shared storage."""
    import optuna

    from . import _private as private
    from ._pruners._companion import load_companion, report_trial
    from ._pruners._kind import build_pruner, pruner_kind, recorded_pruner_args
    from ._study._settings import mapping
    from ._study._storage import MEMORY, Masker, open_storage, storage_spec

    if storage == MEMORY:  # only the sweeper's process can reach it
        log.warning("trial %d: a study in memory takes no reports from another process", number)
        return None
    spec = storage_spec(storage, "hpo.storage", ".", null_is_memory=False)
    store = open_storage(spec, Masker.of([storage]))
    # The sampler is never used here (the sweeper sampled already): random keeps it cheap.
    study = optuna.load_study(
        study_name=hpo.study_name, storage=store, sampler=optuna.samplers.RandomSampler()
    )
    # The pruner as the sweep resolved it (its budget defaults too), not as this job reads it
    pruner_args = recorded_pruner_args(study, mapping(hpo.pruner_args, "hpo.pruner_args"))
    study.pruner = pruner = build_pruner(hpo.pruner, pruner_args, 1, schedule)
    trial = private.live_trial(study, number)
    if len(study.directions) == 1:
        return trial, trial
    if not pruner_kind(hpo.pruner).judges:  # no companion: nothing judges the reports
        return trial, None
    companion = load_companion(study, hpo.report_metric, pruner)
    return trial, report_trial(trial, companion)
