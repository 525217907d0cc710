"""The trial reporter a training job uses to talk to its Optuna trial.

The job finds its trial from `cfg.hpo` alone (study_name, storage, trial_number, all passed by
the sweeper as overrides), so it works in another process or on another machine. When the job
runs in the sweeper's own process the live trial is taken from a registry instead, sparing a
second handle on the storage. Imports stay light here: Hydra's plugin scan imports this module.
"""

from __future__ import annotations

import logging
import math
from typing import Any

log = logging.getLogger(__name__)

# (storage, study_name, trial_number) -> optuna.trial.Trial, filled by the in-process sweeper.
_LIVE_TRIALS: dict[tuple[str, str, int], Any] = {}


def register_live_trial(storage: str, study_name: str, trial: Any) -> None:
    _LIVE_TRIALS[(storage, study_name, trial.number)] = trial


def unregister_live_trial(storage: str, study_name: str, number: int) -> None:
    _LIVE_TRIALS.pop((storage, study_name, number), None)


class OptunaReporter:
    """Reports one metric per evaluation (step = optimizer step) and asks the pruner."""

    def __init__(self, trial: Any, metric: str, can_prune: bool) -> None:
        self.trial = trial
        self.metric = metric
        self.can_prune = can_prune
        self._warned = False

    def report(self, step: int, metrics: dict[str, float]) -> bool:
        value = self._pick(metrics)
        if value is None or not self.can_prune:
            return False
        if not math.isfinite(value):  # divergence is the trainer's call, not the pruner's
            return False
        self.trial.report(value, step)
        return bool(self.trial.should_prune())

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

    def set_attrs(self, attrs: dict[str, Any]) -> None:
        for key, value in attrs.items():
            self.trial.set_user_attr(key, _jsonable(value))


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
    """The reporter for this job's trial; a no-op when the job is not a sweep trial."""
    from app.objective import NullReporter

    hpo = cfg.get("hpo")
    number = hpo.get("trial_number") if hpo is not None else None
    if number is None:  # hpo=optuna in a single run: nothing to report to
        return NullReporter()
    storage, study_name = str(hpo.storage), str(hpo.study_name)
    trial = _LIVE_TRIALS.get((storage, study_name, int(number)))
    if trial is None:
        trial = _trial_from_storage(hpo, storage, study_name, int(number))
    metric = str(hpo.get("report_metric") or "val_loss")
    return OptunaReporter(trial, metric, can_prune=len(trial.study.directions) == 1)


def _trial_from_storage(hpo: Any, storage: str, study_name: str, number: int) -> Any:
    """Rebuild the running trial in this process from the shared storage."""
    import optuna

    from ._settings import build_pruner, read_settings
    from ._study import open_storage

    settings = read_settings(hpo, {})
    store = open_storage(storage)
    # The sampler is never used here (the sweeper sampled already): random keeps it cheap.
    study = optuna.load_study(
        study_name=study_name,
        storage=store,
        sampler=optuna.samplers.RandomSampler(),
        pruner=build_pruner(settings),
    )
    trial_id = store.get_trial_id_from_study_id_trial_number(study._study_id, number)
    return optuna.trial.Trial(study, trial_id)
