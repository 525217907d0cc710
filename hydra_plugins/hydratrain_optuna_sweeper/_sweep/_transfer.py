"""hpo.transfer and the study's parametrization (app/studies/transfer.py): read from the job
config when the sweep is planned, the target composed and checked as a run of its own before
the study is touched (one line where it is wrong), recorded on the study (a study that holds
trials of another parametrization is refused), said in the study's first lines; and once the
study ends, the target run (hpo.transfer.run), launched through the sweep's launcher as one
more job in <sweep dir>/target."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import optuna
from hydra.plugins.launcher import Launcher
from omegaconf import DictConfig, OmegaConf

from app.studies.transfer import (
    RECORD,
    TARGET_DIR,
    TARGET_RUN,
    Parametrization,
    TargetRun,
    target_overrides,
)

from .._errors import SweepConfigError
from .._report._commands import best_overrides, command, target_command
from .._study._checks import Compose, check_job
from .._study._fleet_plan import fleet_worker
from .._study._settings import SweepSettings
from .._study._space import SearchSpace
from .._study._storage import Masker, open_storage
from .._study._warm_sources import storage_exists
from ._outcomes import classify

log = logging.getLogger(__name__)
KEY = "hpo.transfer"


def plan_transfer(
    s: SweepSettings, job_cfg: DictConfig, compose: Compose, space: SearchSpace, config_name: str
) -> None:
    """The parametrization the job config gives the trials (into `s.parametrization`), and
    hpo.transfer's target composed and checked as a run of its own."""
    cfg = s.transfer
    target = tuple(str(o) for o in cfg.target) if cfg is not None else ()
    s.parametrization = record = _parametrization(job_cfg, target)
    if cfg is None:
        return
    if cfg.run and not target:
        raise SweepConfigError(f"{KEY}.run=true: no {KEY}.target to run; give its overrides")
    if target and not record.mup:
        raise SweepConfigError(
            f"{KEY}.target={list(target)}: the trials run {record.describe()}, under which the "
            "best learning rate moves with the width; set model.parametrization=mup and "
            "model.mup.base_width (the proxy's model.n_embd)"
        )
    if target:
        overrides = target_overrides([*space.fixed_overrides({}), *space.deletions], target)
        where = f"{KEY}.target={list(target)}"
        _check_head_width(check_job(compose, overrides, where, config_name), record, where)


def _check_head_width(target: DictConfig, proxy: Parametrization, where: str) -> None:
    """The target's attention stated at the proxy's head width: null means each model's own,
    which a target whose head width grows does not share (its attn_mult would mean another
    scale)."""
    head = _base_head_dim(target)
    if head != proxy.base_head_dim:
        raise SweepConfigError(
            f"{where}: the target states μP's attention at head width {head} "
            f"(model.mup.base_head_dim={_given(target)}), the trials at "
            f"{proxy.base_head_dim}: their values hold there only; set "
            f"model.mup.base_head_dim={proxy.base_head_dim} (the proxy's head width)"
        )


def check_study(s: SweepSettings, mask: Masker) -> None:
    """An existing study whose trials ran under another parametrization is refused before it is
    opened (their values and this sweep's would not compare); nothing is created or written."""
    spec, name = s.storage, s.study_name
    if spec.kind == "memory" or name is None or not storage_exists(spec):
        return
    storage = open_storage(spec, mask)
    if name not in optuna.get_all_study_names(storage):
        return
    study = optuna.load_study(study_name=name, storage=storage)
    had = Parametrization.of(study.user_attrs)
    why = s.parametrization.mismatch(had) if study.get_trials(deepcopy=False) else None
    if why:
        raise SweepConfigError(
            f"study {name!r} {why}: its trials and this sweep's would not compare; choose "
            "another hpo.study_name"
        )


def record_transfer(study: optuna.Study, s: SweepSettings) -> None:
    """The trials' parametrization recorded on the study, and said."""
    if study.user_attrs.get(RECORD) != s.parametrization.attrs():
        study.set_user_attr(RECORD, s.parametrization.attrs())
    if s.parametrization.mup:
        log.info("%s", first_line(s.parametrization, study))


def _parametrization(job_cfg: DictConfig, target: tuple[str, ...]) -> Parametrization:
    name = OmegaConf.select(job_cfg, "model.parametrization", default="standard")
    base = OmegaConf.select(job_cfg, "model.mup.base_width", default=None)
    width = OmegaConf.select(job_cfg, "model.n_embd", default=None)
    return Parametrization(
        name=str(name),
        base_width=base if name == "mup" else None,
        width=width if isinstance(width, int) else None,
        target=target,
        base_head_dim=_base_head_dim(job_cfg) if name == "mup" else None,
    )


def _base_head_dim(job_cfg: DictConfig) -> int | None:
    """model.mup.base_head_dim, or (null) the job's own head width."""
    given = OmegaConf.select(job_cfg, "model.mup.base_head_dim", default=None)
    if isinstance(given, int):
        return given
    width = OmegaConf.select(job_cfg, "model.n_embd", default=None)
    heads = OmegaConf.select(job_cfg, "model.n_head", default=None)
    return width // heads if isinstance(width, int) and isinstance(heads, int) else None


def _given(job_cfg: DictConfig) -> str:
    given = OmegaConf.select(job_cfg, "model.mup.base_head_dim", default=None)
    return "null, its own head width" if given is None else str(given)


def first_line(record: Parametrization, study: optuna.Study) -> str:
    """What the study tunes and, with a target, the command that trains it."""
    head = f"{record.describe()}: its best values hold at any width the base width divides"
    if not record.target:
        return f"{head} (hpo.transfer.target gives the command that trains a wider one)"
    target = " ".join(record.target)
    # a rerun of a study that has a best: the command itself
    how = target_command(study, record.target) or f"<its overrides> {target}"
    return (
        f"{head}; the target ({target}) trains with the best configuration: {how} "
        "(optimization_results.yaml, transfer.command, and report.html give it at the end)"
    )


def run_target(
    study: optuna.Study, s: SweepSettings, launcher: Launcher, sweep_dir: str, status: int
) -> TargetRun | None:
    """hpo.transfer.run, once the study ended well (`status` 0; a fleet's parent, not each of
    its workers): the target trained with the best configuration, as one more job of the
    sweep's launcher (Hydra's own way to run a job), recorded on the study."""
    if status or s.transfer is None or not s.transfer.run or fleet_worker():
        return None
    overrides = best_overrides(study)
    if overrides is None:
        return None
    job = [
        *target_overrides(overrides, s.parametrization.target),
        f"hydra.sweep.subdir={TARGET_DIR}",
    ]
    log.info("Target run: %s", command(job[:-1]))
    number = max(t.number for t in study.get_trials(deepcopy=False)) + 1
    (ret,) = launcher.launch([job], initial_job_idx=number)
    outcome = classify(ret, len(study.directions))
    run_dir = str(outcome.attrs.get("run_dir") or Path(sweep_dir, TARGET_DIR))
    summary = _summary(run_dir)
    seconds = summary.get("device_seconds")
    done = TargetRun(
        run_dir=run_dir,
        status=str(summary.get("status", outcome.state.name.lower())),
        value=outcome.values[0] if outcome.values else None,
        device_seconds=float(seconds) if isinstance(seconds, int | float) else None,
    )
    study.set_user_attr(TARGET_RUN, done.attrs())
    log.info("Target run: %s in %s", done.status, run_dir)
    return done


def _summary(run_dir: str) -> dict[str, object]:
    try:
        found = json.loads(Path(run_dir, "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}
