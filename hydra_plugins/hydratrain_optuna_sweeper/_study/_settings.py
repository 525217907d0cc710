"""The sweep's settings: the stock keys (`hydra.sweeper.*`) and ours (`hpo.*`), read once and
checked before any trial runs.

Each key means one thing wherever it is used. A `hydra.sweeper.*` key means what it means to the
stock hydra-optuna-sweeper; when it is set it replaces the matching `hpo.*` setting. An unset one
(null, in the node `hpo=optuna` selects) leaves `hpo.*` in charge. Every check raises
`SweepConfigError` with one line that names the setting.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from omegaconf import DictConfig, OmegaConf

from app.config.hpo import BatchSizeStudyConfig, HpoConfig, TransferConfig, WarmStartConfig
from app.studies.transfer import Parametrization

from .._errors import SweepConfigError, first_line
from .._pruners._kind import pruner_kind
from ._fleet_plan import FleetAsk
from ._stock import StockOptions, legacy_search_space, plain
from ._storage import StorageSpec, storage_spec

DIRECTIONS = ("minimize", "maximize")


@dataclass(frozen=True)
class TrialCount:
    """The study's budget (`_shared.TrialBudget` hands out its trials): `n_trials` trials (stock:
    this many more per run; ours: a study-wide total), and/or `worth` full trials' worth of
    training (hpo.budget_trials, study-wide), so trials stopped early buy more trials. `key`:
    the setting in charge, as the study's first line names it."""

    n_trials: int | None
    per_run: bool
    key: str
    worth: float | None = None

    @property
    def size(self) -> float | None:
        """What sizes the sampler's random start-up: the trials, or their worth."""
        return self.n_trials if self.n_trials is not None else self.worth


@dataclass(frozen=True)
class FailureRule:
    max_rate: float
    per_batch: bool  # stock: the FAIL share of each batch; ours: of this worker's trials
    min_trials: int  # ours: trials this worker finishes before the rate is checked
    key: str


@dataclass(frozen=True)
class Liveness:
    heartbeat_interval: float
    stale_after: float
    retry_stale: int
    wait_for_running: bool  # at the end of a study-wide budget, wait for other workers
    poll_interval: float


@dataclass
class SweepSettings:
    study_name: str | None  # None: Optuna names a fresh study
    storage: StorageSpec
    budget: TrialCount
    n_jobs: int
    directions: list[str | None]  # None: the metric's own direction (filled once known)
    direction_key: str
    metrics: list[str] | None  # None: the job's return value is the objective (stock)
    report_metric: str | None
    sampler: DictConfig  # a node with _target_ (a stock sampler config)
    sampler_key: str
    pruner: str
    pruner_args: dict[str, object]
    failure: FailureRule
    search_space_fn: str | None
    search_space_key: str
    liveness: Liveness
    # (mapping, setting) pairs of search-space entries, in order
    space_sources: list[tuple[Mapping[str, object], str]]
    # hydra.sweeper.search_space where it is in charge: {key: distribution config}, before
    # the command line's entries
    search_space: Mapping[str, object] | None = None
    enqueue: list[dict[str, object]] = field(default_factory=list)
    tensorboard: bool = False
    # The job config has an hpo node: jobs are told their trial there (++hpo.*), and the
    # settings a job can only read there (hpo.report_metric, OOM as infeasible) apply. An app
    # without one is told its trial in its environment (reporter.TRIAL_ENV), with the defaults.
    hpo_node: bool = False
    budget_s: float | None = None  # hpo.budget_s: device-seconds the study may spend
    batch_size_study: BatchSizeStudyConfig | None = None  # hpo.batch_size_study, as typed
    # hpo.report_metric's own direction (filled once known): the pruning companion's, for
    # several objectives
    report_direction: str = "minimize"
    fleet: FleetAsk | None = None  # None: no hpo node (the stock surface alone), no fleet
    warm_start: WarmStartConfig | None = None  # hpo.warm_start; None: no hpo node
    transfer: TransferConfig | None = None  # hpo.transfer; None: no hpo node
    # How the trials are parametrized (filled once the job config is known: _sweep/_transfer)
    parametrization: Parametrization = field(default_factory=Parametrization)

    @property
    def multi_objective(self) -> bool:
        return len(self.directions) > 1


def read_hpo(node: object) -> HpoConfig | None:
    """`hpo.*` resolved and typed by its schema, so a misspelled key is one line; None when
    the config has no hpo node (a sweep of the stock surface alone)."""
    return None if node is None else typed_hpo(node)


def typed_hpo(node: object) -> HpoConfig:
    """An hpo node (a DictConfig or a mapping) typed by HpoConfig, its defaults filled in."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(HpoConfig), plain(node))
        hpo: HpoConfig = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except Exception as e:
        raise SweepConfigError(_hpo_error(e)) from None
    for key in ("sampler_args", "pruner_args", "params"):
        setattr(hpo, key, mapping(getattr(hpo, key), f"hpo.{key}"))
    return hpo


def _hpo_error(exc: Exception) -> str:
    key = getattr(exc, "full_key", None) or getattr(exc, "key", None)
    if key and "not in" in str(exc):
        known = ", ".join(f.name for f in dataclasses.fields(HpoConfig))
        return f"hpo.{key}: no such setting in hpo; known keys: {known}"
    return f"hpo.{key}: {first_line(exc)}" if key else f"hpo: {first_line(exc)}"


def mapping(value: object, key: str) -> dict[str, object]:
    """A mapping setting (null: empty) as a plain dict of key: value."""
    value = plain(value)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SweepConfigError(f"{key}={value!r} must be a mapping of key: value")
    return {str(k): v for k, v in value.items()}


def read_settings(stock: StockOptions, hpo_node: object, sweep_dir: str) -> SweepSettings:
    from ._samplers import sampler_node

    hpo = read_hpo(hpo_node)
    h = hpo or typed_hpo({})  # the defaults, normalized as a node would be
    direction, direction_key = stock.pick("direction", h.direction)
    space_fn, space_fn_key = stock.pick("custom_search_space", h.search_space_fn)
    metrics = _metrics(h.metric) if hpo else None
    legacy = legacy_search_space(stock)
    stock_sampler, n_jobs = stock.get("sampler"), stock.get("n_jobs")
    budget = _trial_budget(stock, h)
    s = SweepSettings(
        study_name=_study_name(stock, h),
        storage=_storage(stock, h, sweep_dir),
        budget=budget,
        n_jobs=_count(1 if n_jobs is None else n_jobs, "hydra.sweeper.n_jobs"),
        directions=_directions(direction, direction_key, metrics),
        direction_key=direction_key,
        metrics=metrics,
        report_metric=h.report_metric if hpo else None,
        sampler=sampler_node(
            stock_sampler,
            h.sampler,
            mapping(h.sampler_args, "hpo.sampler_args"),
            h.seed,
            budget.size,
        ),
        sampler_key="hpo.sampler" if stock_sampler is None else "hydra.sweeper.sampler",
        pruner=h.pruner,
        pruner_args=mapping(h.pruner_args, "hpo.pruner_args"),
        failure=_failure_rule(stock, h),
        search_space_fn=None if space_fn is None else str(space_fn),
        search_space_key=space_fn_key,
        liveness=Liveness(
            h.heartbeat_interval, h.stale_after, h.retry_stale, h.wait_for_running, h.poll_interval
        ),
        space_sources=[] if legacy is not None else _space_sources(stock.get("params"), hpo),
        search_space=legacy,
        enqueue=[mapping(p, f"hpo.enqueue[{i}]") for i, p in enumerate(h.enqueue)] if hpo else [],
        tensorboard=bool(hpo and h.tensorboard),
        hpo_node=hpo is not None,
        budget_s=h.budget_s if hpo else None,
        batch_size_study=h.batch_size_study if hpo else None,
        fleet=_fleet_ask(h) if hpo else None,
        warm_start=h.warm_start if hpo else None,
        transfer=h.transfer if hpo else None,
    )
    check(s)
    _check_resource(h)
    return s


def _check_resource(h: HpoConfig) -> None:
    """hpo.max_resource and hpo.report_every: positive, the interval within the whole."""
    for key in ("max_resource", "report_every"):
        value = getattr(h, key)
        if value is not None and value < 1:
            raise SweepConfigError(
                f"hpo.{key}={value} must be a positive integer in the steps the app reports, "
                "or null to learn it from the first trial that completes"
            )
    last, every = h.max_resource, h.report_every
    if last is not None and every is not None and every > last:
        raise SweepConfigError(
            f"hpo.report_every={every} must not exceed hpo.max_resource={last}: a full trial "
            "reports at least once"
        )


def _trial_budget(stock: StockOptions, h: HpoConfig) -> TrialCount:
    """hydra.sweeper.n_trials (more per run), else hpo.n_trials (a study-wide count) where
    set, else hpo.budget_trials (study-wide, in full trials' worth)."""
    n_trials, key = stock.pick("n_trials", h.n_trials)
    if n_trials is not None:
        return TrialCount(_count(n_trials, key), stock.get("n_trials") is not None, key)
    worth = h.budget_trials
    number = isinstance(worth, int | float) and not isinstance(worth, bool)
    if not (number and worth > 0 and math.isfinite(worth)):
        raise SweepConfigError(
            f"hpo.budget_trials={worth!r} must be a positive number of full trials' worth "
            "(or set hpo.n_trials to count trials instead)"
        )
    return TrialCount(None, False, "hpo.budget_trials", worth=float(worth))


def _fleet_ask(h: HpoConfig) -> FleetAsk:
    return FleetAsk.of(
        h.workers,
        h.devices,
        h.gpus_per_trial,
        h.trials_per_gpu,
        h.max_trials_per_gpu,
        h.gpu_memory_gib,
    )


def _study_name(stock: StockOptions, h: HpoConfig) -> str | None:
    if stock.stock_node or stock.get("study_name") is not None:
        name = stock.get("study_name")
        return None if name is None else str(name)
    return h.study_name


def _storage(stock: StockOptions, h: HpoConfig, sweep_dir: str) -> StorageSpec:
    value = stock.get("storage")
    if stock.stock_node or value is not None:
        return storage_spec(value, "hydra.sweeper.storage", sweep_dir, null_is_memory=True)
    return storage_spec(h.storage, "hpo.storage", sweep_dir, null_is_memory=False)


def _space_sources(params: object, hpo: HpoConfig | None) -> list[tuple[Mapping[str, object], str]]:
    """hydra.sweeper.params when it names a key to search or fix; else hpo.params, less the
    keys hydra.sweeper.params sets to null."""
    own = mapping(params, "hydra.sweeper.params")
    if any(v is not None for v in own.values()) or hpo is None:
        return [(own, "hydra.sweeper.params")]
    return [(mapping(hpo.params, "hpo.params"), "hpo.params"), (own, "hydra.sweeper.params")]


def _failure_rule(stock: StockOptions, h: HpoConfig) -> FailureRule:
    rate = stock.get("max_failure_rate")
    if rate is not None:
        key = "hydra.sweeper.max_failure_rate"
        return FailureRule(_number(rate, key), True, 1, key)
    return FailureRule(
        float(h.max_failure_rate), False, h.min_trials_for_failure_rate, "hpo.max_failure_rate"
    )


def _as_list(value: object) -> list[object]:
    value = plain(value)
    if value is None:
        return []
    if isinstance(value, str) or not isinstance(value, Sequence):
        return [value]
    return list(value)


def _metrics(value: object) -> list[str]:
    """hpo.metric: one summary key, or a list of them (several objectives)."""
    metrics = _as_list(value)
    names = [m for m in metrics if isinstance(m, str)]
    if not names or len(names) != len(metrics):
        raise SweepConfigError(f"hpo.metric={metrics} must name one or more summary keys")
    return names


def _directions(value: object, key: str, metrics: list[str] | None) -> list[str | None]:
    if value is None:  # hpo.direction: null -> each metric's own, once known
        return [None] * len(metrics or [None])
    directions: list[str | None] = []
    for d in _as_list(value):
        name = getattr(d, "name", d)  # stock Direction enums
        if not isinstance(name, str) or name not in DIRECTIONS:
            raise SweepConfigError(
                f"{key}={name!r} is not allowed; choose one of: minimize, maximize"
            )
        directions.append(name)
    return directions


def check(s: SweepSettings) -> None:
    if s.metrics is not None and len(s.directions) != len(s.metrics):
        raise SweepConfigError(
            f"{s.direction_key} has {len(s.directions)} entries but hpo.metric has "
            f"{len(s.metrics)}; give one direction per metric"
        )
    pruner_kind(s.pruner)  # one line naming the allowed ones
    f = s.failure
    if not 0.0 <= f.max_rate <= 1.0:
        raise SweepConfigError(f"{f.key}={f.max_rate} must be in [0, 1]")
    _check_liveness(s.liveness)
    _check_budget_s(s.budget_s)


def _check_budget_s(value: float | None) -> None:
    if value is None:
        return
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not (number and value > 0 and math.isfinite(value)):
        raise SweepConfigError(
            f"hpo.budget_s={value!r} must be a positive number of device-seconds, "
            "or null for no cap"
        )


def _check_liveness(live: Liveness) -> None:
    for key in ("heartbeat_interval", "stale_after", "poll_interval"):
        value = getattr(live, key)
        if not (value > 0 and math.isfinite(value)):
            raise SweepConfigError(f"hpo.{key}={value} must be a positive number of seconds")
    if live.stale_after <= live.heartbeat_interval:
        raise SweepConfigError(
            f"hpo.stale_after={live.stale_after} must exceed hpo.heartbeat_interval="
            f"{live.heartbeat_interval}, or live trials would be failed as stale"
        )
    if live.retry_stale < 0:
        raise SweepConfigError(f"hpo.retry_stale={live.retry_stale} must be 0 or more")


def _count(value: object, key: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise SweepConfigError(f"{key}={value!r} must be a positive integer")


def _number(value: object, key: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise SweepConfigError(f"{key}={value!r} must be a number")
