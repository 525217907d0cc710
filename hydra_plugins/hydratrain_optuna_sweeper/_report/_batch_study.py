"""hpo.batch_size_study: the study's completed trials as the analysis reads them
(app/studies/batch_size.py), its answer beside optimization_results.yaml."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import optuna
from optuna.trial import TrialState

from app.config.hpo import BatchSizeStudyConfig
from app.hpo import TrialAttrs
from app.studies import batch_size
from app.studies.batch_size import BatchTrial

from .._study._warm_start import is_borrowed

log = logging.getLogger(__name__)


def batch_trials(study: optuna.Study) -> list[BatchTrial]:
    """Each completed trial: its batch and learning rate (as it trained, lr_scaling applied),
    its curve on the study's report axis (samples seen under a sample budget), its noise
    scale and the probe's throughput at its batch; an adaptive trial's batches over its data."""
    rows = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if is_borrowed(t):  # an earlier study's (hpo.warm_start): not trained here
            continue
        attrs = TrialAttrs.from_user_attrs(t.user_attrs)
        batch = attrs.effective_batch_size or t.params.get("training.effective_batch_size")
        lr = attrs.lr or t.params.get("training.lr")
        if batch is None or lr is None or t.values is None:
            continue
        rows.append(
            BatchTrial(
                batch=int(batch),
                lr=float(lr),
                final_loss=float(t.values[0]),
                curve=sorted(t.intermediate_values.items()),
                noise_scale=attrs.noise_scale,
                samples_per_sec=attrs.probe_samples_per_sec,
                noise_curve=noise_curve(attrs.run_dir),
                phases=tuple((p["samples"], p["batch"]) for p in attrs.batch_schedule or ()),
            )
        )
    return rows


def noise_curve(run_dir: str | None) -> list[tuple[int, float]]:
    """(samples seen, B_simple) at each log point of a run, from its metrics.jsonl; empty where
    the run dir is not on this machine or logged none."""
    path = Path(run_dir or "", "metrics.jsonl")
    if not run_dir or not path.is_file():
        return []
    curve = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        value, seen = record.get("train/noise_scale"), record.get("data/samples_seen")
        if value is not None and seen is not None:
            curve.append((int(seen), float(value)))
    return curve


def write_batch_study(
    study: optuna.Study, cfg: BatchSizeStudyConfig, sweep_dir: str
) -> dict[str, object] | None:
    """The analysis for optimization_results.yaml, its image written beside it; None (one
    warning) where it cannot be made: a study's results never fail over it."""
    try:
        result = batch_size.analyse(batch_trials(study), cfg.target_loss)
        image = batch_size.plot(result, Path(sweep_dir, batch_size.IMAGE))
    except Exception as e:
        log.warning("batch-size study not analysed: %s", e)
        return None
    log.info("Batch-size study (%s):\n%s", image, batch_size.table(result))
    return {**result.as_dict(), "image": str(image)}
