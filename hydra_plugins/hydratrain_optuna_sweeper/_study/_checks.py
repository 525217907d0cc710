"""Checks that compose a job's config, so a bad sweep is one line before the study is touched.

Every searched value is tried: each choice, both ends of a range or interval, composed into a
job config with the other keys at their first value and put through the app's own validation
(`app.config.schema.validate`, the one a training run does on entry). Then `hpo.metric` and
`hpo.report_metric` are checked against what a run of that config produces
(`app.hpo.objectives`), and the job's `objective` against `hpo.metric`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from omegaconf import DictConfig, OmegaConf, open_dict

from app.config.compose import one_line
from app.config.jobs import check_job_config, task_of
from app.core.errors import ConfigError
from app.hpo import objectives

from .._errors import SweepConfigError
from .._pruners._kind import pruner_kind
from ._settings import SweepSettings
from ._space import SearchSpace, Value, ends

Compose = Callable[[list[str]], DictConfig]


def check_space(compose: Compose, space: SearchSpace, config_name: str) -> DictConfig:
    """The job config with the fixed overrides alone, after each searched value, composed
    into it in turn, passed."""
    cfg = _job_config(compose, space, {}, config_name, "hydra.sweeper.params / overrides")
    for key, dist in space.distributions.items():
        for value in ends(dist):
            _job_config(compose, space, {key: value}, config_name, space.shown[key])
    return cfg


def _job_config(
    compose: Compose, space: SearchSpace, point: dict[str, Value], config_name: str, where: str
) -> DictConfig:
    overrides = [
        *space.fixed_overrides(point),
        *(space.override(k, v) for k, v in point.items()),
        *space.deletions,
    ]
    return check_job(compose, overrides, where, config_name)


def check_job(compose: Compose, overrides: list[str], where: str, config_name: str) -> DictConfig:
    """The job these overrides make, composed and through the app's own checks."""
    try:
        cfg = compose(overrides)
    except Exception as e:
        raise SweepConfigError(f"{where}: {one_line(e, config_name, overrides)}") from None
    with open_dict(cfg):
        cfg.pop("hydra", None)
    try:
        check_job_config(cfg)  # a training run's config: the app's own checks
    except ConfigError as e:
        raise SweepConfigError(f"{where}: {e}") from None
    return cfg


def check_objectives(cfg: DictConfig, s: SweepSettings) -> None:
    """hpo.metric and hpo.report_metric name what a run produces; a null direction becomes
    the metric's own; the job returns hpo.metric."""
    if s.metrics is None:  # the job's return value is the objective (stock)
        s.directions = [d or "minimize" for d in s.directions]
        return
    known = objectives(task_of(cfg))
    natural = known.final if known is not None else {}
    if known is not None:
        _one_of("hpo.metric", s.metrics, known.final, "a summary key a run writes")
        _one_of("hpo.report_metric", [s.report_metric], known.reported, "reported at evaluations")
    s.directions = [
        d or natural.get(m, "minimize") for d, m in zip(s.directions, s.metrics, strict=True)
    ]
    if known is not None and s.report_metric is not None:
        s.report_direction = known.reported[s.report_metric]
    _check_objective_key(cfg, s.metrics)
    _check_resumable(cfg, s)


def _check_resumable(cfg: DictConfig, s: SweepSettings) -> None:
    """A paused trial resumes from its checkpoint through training.resume."""
    training = cfg.get("training")
    if pruner_kind(s.pruner).pauses and (training is None or "resume" not in training):
        raise SweepConfigError(
            f"hpo.pruner={s.pruner} pauses trials and resumes them from their run dir, but the "
            "job config has no training.resume; choose another hpo.pruner"
        )


def _one_of(key: str, names: Sequence[str | None], allowed: dict[str, str], what: str) -> None:
    for name in names:
        if name not in allowed:
            raise SweepConfigError(
                f"{key}={name!r} is not {what}; choose one of: {', '.join(sorted(allowed))}"
            )


def _check_objective_key(cfg: DictConfig, metrics: list[str]) -> None:
    if "objective" not in cfg:
        return
    returned = cfg.objective
    if OmegaConf.is_config(returned):
        returned = OmegaConf.to_container(returned, resolve=True)
    as_list = [returned] if isinstance(returned, str) else list(returned or [])
    if as_list != metrics:
        shown = metrics[0] if len(metrics) == 1 else metrics
        raise SweepConfigError(
            f"objective={returned} but hpo.metric={shown}: the trials would return {returned}; "
            "leave `objective` unset under hpo=optuna (it follows hpo.metric)"
        )
