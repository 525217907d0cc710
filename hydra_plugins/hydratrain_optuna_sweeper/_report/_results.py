"""What a sweep leaves in its directory: optimization_results.yaml and TensorBoard hparams.

optimization_results.yaml has the stock sweeper's keys (`name`, and `best_params` +
`best_value`, or `solutions` for several objectives) and ours beside them (the study, its
storage with any password masked, the trial counts, the best trial's number and run dir).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import optuna
from omegaconf import OmegaConf
from optuna.trial import FrozenTrial, TrialState

from app.config.hpo import BatchSizeStudyConfig
from app.core.atomic import atomic_write_text
from app.hpo import TrialAttrs

from .._errors import NoTrialCompleted
from .._study._best import own_best, own_front
from .._study._warm_start import RECORD, is_borrowed
from ._commands import transfer_record

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

log = logging.getLogger(__name__)

RESULTS_FILE = "optimization_results.yaml"


def check_completed(study: optuna.Study) -> None:
    """Raise NoTrialCompleted unless a trial of the study completed, in this run or any other:
    a rerun that adds only failed or pruned trials to a study with a best value ends well."""
    counts = trial_counts([t for t in study.get_trials(deepcopy=False) if not is_borrowed(t)])
    if not counts.get(TrialState.COMPLETE.name):
        by_state = ", ".join(f"{state}: {n}" for state, n in sorted(counts.items())) or "none"
        raise NoTrialCompleted(
            f"no trial of study {study.study_name!r} completed (trials by state: {by_state})"
        )


def trial_counts(trials: list[FrozenTrial]) -> dict[str, int]:
    return dict(Counter(t.state.name for t in trials))


def _solution(t: FrozenTrial) -> dict[str, object]:
    return {
        "params": dict(t.params),
        "values": list(t.values or []),
        "number": t.number,
        "run_dir": t.user_attrs.get("run_dir"),
    }


def summarize(
    study: optuna.Study,
    storage: str,
    metrics: list[str] | None,
    batch_study: BatchSizeStudyConfig | None = None,
    sweep_dir: str = ".",
) -> dict[str, object]:
    every = study.get_trials(deepcopy=False)
    trials = [t for t in every if not is_borrowed(t)]  # this study's own
    data: dict[str, object] = {
        "name": "optuna",
        "study_name": study.study_name,
        "storage": storage,
        "directions": [d.name.lower() for d in study.directions],
        **({"metrics": metrics} if metrics else {}),
        "trials": trial_counts(trials),
        **({"warm_start": study.user_attrs[RECORD]} if RECORD in study.user_attrs else {}),
        **({"transfer": t.section()} if (t := transfer_record(study)) is not None else {}),
    }
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    if not complete:
        return data
    if len(study.directions) == 1:
        best = study.best_trial if len(trials) == len(every) else own_best(study, complete)
        data.update(
            best_params=dict(best.params),
            best_value=best.value,
            best_trial=best.number,
            best_run_dir=best.user_attrs.get("run_dir"),
        )
    else:
        front = study.best_trials if len(trials) == len(every) else own_front(study, complete)
        data["solutions"] = [_solution(t) for t in front]  # the Pareto front
    if batch_study is not None:
        from ._batch_study import write_batch_study

        data["batch_size_study"] = write_batch_study(study, batch_study, sweep_dir)
    return data


def write_results(
    study: optuna.Study,
    storage: str,
    metrics: list[str] | None,
    sweep_dir: str,
    batch_study: BatchSizeStudyConfig | None = None,
) -> Path:
    """Atomically (re)write the results; the last worker to finish leaves the final picture."""
    path = Path(sweep_dir, RESULTS_FILE)
    data = summarize(study, storage, metrics, batch_study, sweep_dir)
    atomic_write_text(path, OmegaConf.to_yaml(OmegaConf.create(data)))
    return path


class HParamsWriter:
    """One TensorBoard hparams run per trial under <sweep dir>/tensorboard (HParams tab)."""

    def __init__(self, sweep_dir: str) -> None:
        self.root = str(Path(sweep_dir, "tensorboard"))
        self._writer: SummaryWriter | None = None

    def write(self, trial: FrozenTrial, metrics: list[str] | None) -> None:
        try:
            self._write(trial, metrics)
        except Exception as e:  # TensorBoard is a convenience; never fail a sweep over it
            log.warning("TensorBoard hparams for trial %d not written: %s", trial.number, e)

    def _write(self, trial: FrozenTrial, metrics: list[str] | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        if self._writer is None:
            self._writer = SummaryWriter(log_dir=self.root)
        hparams = {k: _hparam(v) for k, v in trial.params.items()}
        hparams["state"] = trial.state.name
        values = list(trial.values or [])
        scores = {
            f"hpo/{m}": (values[i] if i < len(values) else math.nan)
            for i, m in enumerate(metrics or [])
        }
        if trial.intermediate_values:
            scores["hpo/last_reported"] = trial.intermediate_values[max(trial.intermediate_values)]
        attrs = TrialAttrs.from_user_attrs(trial.user_attrs)
        figures = {
            "tokens_per_sec": attrs.tokens_per_sec,
            "peak_memory_bytes": attrs.peak_memory_bytes,
            "micro_batch_size": attrs.micro_batch_size,
            "device_seconds": attrs.device_seconds,
        }
        scores.update({f"trial/{k}": float(v) for k, v in figures.items() if v is not None})
        self._writer.add_hparams(hparams, scores, run_name=f"trial_{trial.number:04d}")
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def _hparam(value: object) -> bool | int | float | str:
    return value if isinstance(value, bool | int | float | str) else str(value)
