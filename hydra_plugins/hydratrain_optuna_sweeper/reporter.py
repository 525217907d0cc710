"""The trial reporter a training job uses to talk to its Optuna trial.

The sweeper names this module's `reporter_for_job` in each job's `hpo.reporter`, with the
study, its storage and the trial number, so app/hpo.py (build_reporter) finds it without
importing this package. When the job runs in the sweeper's own process the live trial is taken
from a registry; in another process it is rebuilt from the storage. Imports stay light here:
Hydra's plugin scan imports this module.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

from app.hpo import NullReporter, Paused, TrialAttrs

log = logging.getLogger(__name__)

# (storage, study_name, trial_number) -> (the trial, the trial its reports go to: itself, or
# its pruning companion), filled by the in-process sweeper.
_LIVE_TRIALS: dict[tuple[str, str, int], tuple[Any, Any]] = {}


def register_live_trial(storage: str, study_name: str, trial: Any, judge: Any) -> None:
    """`judge`: the trial its reports go to (itself, its companion), None for no reports."""
    _LIVE_TRIALS[(storage, study_name, trial.number)] = (trial, judge)


def unregister_live_trial(storage: str, study_name: str, number: int) -> None:
    _LIVE_TRIALS.pop((storage, study_name, number), None)


class OptunaReporter:
    """Reports one metric per evaluation (step = optimizer step) and asks the pruner.

    `judge` takes the reports: the trial itself, or its companion trial when the study has
    several objectives (`_companion.py`). Under hpo.pruner=asha the pruner's "stop" is a pause
    at a rung: Paused is raised, and the run checkpoints that step.

    A trial that another worker failed as stale (this one was paused past hpo.stale_after)
    can no longer be changed: the job then goes on without reporting, after one warning."""

    def __init__(self, trial: Any, metric: str, can_prune: bool = True, judge: Any = None) -> None:
        self.trial = trial
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
        if stop and self.pauses:
            raise Paused(f"paused at step {step} (hpo.pruner=asha): checkpointed", step=step)
        return stop

    def _report(self, value: float, step: int) -> bool:
        self.judge.report(value, step)
        return self.judge.should_prune()

    def _pick(self, metrics: dict[str, float]) -> float | None:
        for key in (self.metric, self.metric.removeprefix("final_"), f"final_{self.metric}"):
            if key in metrics and metrics[key] is not None:
                return float(metrics[key])
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
            self._call(lambda k=key, v=value: self.trial.set_user_attr(k, _jsonable(v)))

    def _call(self, fn: Any) -> Any:
        from . import _private as private
        from ._storage import retrying

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


def _pauses(trial: Any) -> bool:
    from ._asha import AshaPruner

    return isinstance(getattr(trial.study, "pruner", None), AshaPruner)


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)  # paths, dtypes, devices


def reporter_for_job(cfg: Any) -> Any:
    """The reporter for this job's trial (cfg.hpo names it); `cfg` is the job's typed config."""
    hpo = cfg.hpo
    storage, study_name, number = str(hpo.storage), str(hpo.study_name), int(hpo.trial_number)
    metric = str(getattr(hpo, "report_metric", None) or "val_loss")
    pair = _LIVE_TRIALS.get((storage, study_name, number))
    if pair is None:
        pair = _trial_from_storage(cfg, storage, study_name, number)
    if pair is None:
        return NullReporter()
    trial, judge = pair
    return OptunaReporter(trial, metric, can_prune=judge is not None, judge=judge)


def _trial_from_storage(cfg: Any, storage: str, study_name: str, number: int) -> Any:
    """(the running trial, the trial its reports go to), rebuilt in this process from the
    shared storage."""
    import optuna
    from omegaconf import OmegaConf

    from . import _private as private
    from ._companion import load_companion, report_trial
    from ._samplers import EvalSchedule, build_pruner
    from ._settings import typed_hpo
    from ._storage import MEMORY, Masker, open_storage, storage_spec

    if storage == MEMORY:  # only the sweeper's process can reach it
        log.warning("trial %d: a study in memory takes no reports from another process", number)
        return None
    hpo = cfg.hpo  # typed by the app, or a DictConfig of another app's
    node = hpo if OmegaConf.is_config(hpo) else dataclasses.asdict(hpo)
    settings = typed_hpo(node)
    spec = storage_spec(storage, "hpo.storage", ".", null_is_memory=False)
    store = open_storage(spec, Masker.of([storage]))
    pruner = build_pruner(settings.pruner, dict(settings.pruner_args), 1, EvalSchedule.of(cfg))
    # The sampler is never used here (the sweeper sampled already): random keeps it cheap.
    study = optuna.load_study(
        study_name=study_name,
        storage=store,
        sampler=optuna.samplers.RandomSampler(),
        pruner=pruner,
    )
    trial = private.live_trial(study, number)
    if len(study.directions) == 1:
        return trial, trial
    if settings.pruner == "none":  # no companion: nothing judges the reports
        return trial, None
    companion = load_companion(study, settings.report_metric, pruner)
    return trial, report_trial(trial, companion)
