"""The commands a study gives: the best trial's rerun (its own overrides, less those that made
it a trial) and, for a study on a proxy (hpo.transfer.target), the target's."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

import optuna
from omegaconf import OmegaConf
from optuna.trial import TrialState

from app.core.redact import mask_url_passwords
from app.studies.transfer import Parametrization, TargetRun, Transfer, target_overrides

from .._study._best import own_best
from .._study._warm_start import is_borrowed

# Job overrides that make a run a trial: a rerun of the configuration leaves them out.
JOB_ONLY = ("hpo=", "hpo.", "+hpo.", "++hpo.", "training.resume=")


def trial_overrides(run_dir: str | None) -> list[str] | None:
    """The overrides a trial's job ran with (Hydra's record of it), less those that made it a
    trial; None where there is no record."""
    path = Path(run_dir or "", ".hydra", "overrides.yaml")
    if not run_dir or not path.is_file():
        return None
    try:
        overrides = [str(o) for o in OmegaConf.load(path)]
    except Exception:  # a damaged record: no command rather than a wrong one
        return None
    return [o for o in overrides if not o.startswith(JOB_ONLY)]


def command(overrides: Sequence[str]) -> str:
    """`python -m app.train` with these overrides; a URL's password (a tracker's URI, a data
    URL) is *** here as in every file the sweep writes."""
    return mask_url_passwords(" ".join(["python -m app.train", *map(shlex.quote, overrides)]))


def best_overrides(study: optuna.Study) -> list[str] | None:
    """The best trial's rerun overrides (one objective; its own trials, not borrowed ones)."""
    if len(study.directions) != 1:
        return None
    trials = study.get_trials(deepcopy=False)
    done = [t for t in trials if t.state == TrialState.COMPLETE and not is_borrowed(t)]
    return trial_overrides(own_best(study, done).user_attrs.get("run_dir")) if done else None


def transfer_record(study: optuna.Study) -> Transfer | None:
    """A μP study's record, the target's command with its best configuration and the target
    run if one ran (None: a study of the standard parametrization)."""
    record = Parametrization.of(study.user_attrs)
    if not record.mup:
        return None
    target = target_command(study, record.target) if record.target else None
    return Transfer(record, target, TargetRun.of(study.user_attrs))


def target_command(study: optuna.Study, target: Sequence[str]) -> str | None:
    """The command that trains the target with the study's best configuration (None: no best
    yet)."""
    best = best_overrides(study)
    return command(target_overrides(best, target)) if best is not None else None
