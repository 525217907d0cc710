"""The peers, each as its users run it, under the protocol (`protocol.py`): their own defaults
but for the fidelity range, the halving rate (3) and the seed, which every contender shares.

Continuing a trial (pays its furthest fidelity): Optuna's TPE with its HyperbandPruner, Syne
Tune's ASHA and BOHB (its ASHA with a KDE searcher), Ray Tune's ASHA with an Optuna searcher.
Restarting a configuration at each budget (pays every evaluation): SMAC3's multi-fidelity
facade (Hyperband), DEHB. Each runs one trial at a time, as this sweeper's study here does.
Installed as the `bench-peers` extra, but DEHB: its metadata pins numpy<2, which this project's
data stack (pyarrow >= 24 under datasets) cannot take; `pip install --no-deps dehb loguru dask
distributed` runs it beside NumPy 2 (docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import tempfile
from collections.abc import Callable, Iterator

from app.bench.studies.mf.hartmann import MAX_FIDELITY
from app.bench.studies.mf.protocol import ETA, EVERY, MIN_FIDELITY, BudgetSpent, Ledger

Run = Callable[[Ledger, int], None]  # (the study's ledger, its seed): runs until spent
REPORTS = range(EVERY, MAX_FIDELITY + 1, EVERY)  # a continuing trial's fidelities
EPOCHS = MAX_FIDELITY // EVERY  # the same, counted as epochs (Syne Tune's, Ray Tune's time)


def names(dims: int) -> list[str]:
    return [f"x{i}" for i in range(dims)]


def point(config: dict[str, object], dims: int) -> tuple[float, ...]:
    return tuple(float(config[k]) for k in names(dims))  # type: ignore[arg-type]


def optuna_hyperband(ledger: Ledger, seed: int) -> None:
    """`optuna.create_study(sampler=TPESampler(seed), pruner=HyperbandPruner(5, 100, 3))`,
    reporting every 5."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    pruner = optuna.pruners.HyperbandPruner(MIN_FIDELITY, MAX_FIDELITY, ETA)
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed), pruner=pruner)
    dims = ledger.bench.dims
    with contextlib.suppress(BudgetSpent):
        while ledger.left:
            trial = study.ask()
            x = tuple(trial.suggest_float(n, 0.0, 1.0) for n in names(dims))
            for z in REPORTS:
                value = ledger.evaluate(x, z, trial=trial.number)
                trial.report(value, z)
                if z < MAX_FIDELITY and trial.should_prune():
                    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                    break
            else:
                study.tell(trial, value)


def smac_multi_fidelity(ledger: Ledger, seed: int) -> None:
    """SMAC3's `MultiFidelityFacade` (random forest, Hyperband), budgets in [5, 100], eta 3."""
    from ConfigSpace import ConfigurationSpace, Float
    from smac import MultiFidelityFacade, Scenario
    from smac.runhistory.dataclasses import TrialValue

    dims = ledger.bench.dims
    space = ConfigurationSpace(seed=seed)
    space.add([Float(n, (0.0, 1.0)) for n in names(dims)])
    with tempfile.TemporaryDirectory(prefix="bench-smac-") as out:
        scenario = Scenario(
            space,
            deterministic=True,
            n_trials=100_000,  # the ledger ends the study
            min_budget=MIN_FIDELITY,
            max_budget=MAX_FIDELITY,
            seed=seed,
            output_directory=out,
        )
        intensifier = MultiFidelityFacade.get_intensifier(scenario, eta=ETA)
        smac = MultiFidelityFacade(
            scenario, _unused, intensifier=intensifier, overwrite=True, logging_level=40
        )
        with contextlib.suppress(BudgetSpent):
            while ledger.left:
                info = smac.ask()
                value = ledger.evaluate(point(dict(info.config), dims), info.budget)
                smac.tell(info, TrialValue(cost=value))


def _unused(config: object, seed: int = 0, budget: float = 0.0) -> float:
    raise AssertionError("the study is driven by ask and tell")


def dehb(ledger: Ledger, seed: int) -> None:
    """DEHB with fidelities [5, 100], eta 3, one worker, by ask and tell."""
    from ConfigSpace import ConfigurationSpace, Float
    from dehb import DEHB

    dims = ledger.bench.dims
    space = ConfigurationSpace(seed=seed)
    space.add([Float(n, (0.0, 1.0)) for n in names(dims)])
    with tempfile.TemporaryDirectory(prefix="bench-dehb-") as out, _quiet("distributed"):
        opt = DEHB(
            cs=space,
            dimensions=dims,
            min_fidelity=MIN_FIDELITY,
            max_fidelity=MAX_FIDELITY,
            eta=ETA,
            n_workers=1,
            output_path=out,
            seed=seed,
            log_level="ERROR",
        )
        with contextlib.suppress(BudgetSpent):
            while ledger.left:
                job = opt.ask()
                value = ledger.evaluate(point(dict(job["config"]), dims), job["fidelity"])
                opt.tell(job, {"fitness": value, "cost": job["fidelity"]})


def syne_tune(kind: str) -> Run:
    """Syne Tune's `ASHA` or `BOHB` baseline (stopping-type, grace period 5, max 100, reduction
    factor 3), driven one trial at a time through its scheduler interface, as its tuner does
    with one worker."""

    def run(ledger: Ledger, seed: int) -> None:
        from syne_tune.backend.trial_status import Trial
        from syne_tune.config_space import uniform
        from syne_tune.optimizer import baselines
        from syne_tune.optimizer.scheduler import SchedulerDecision

        dims = ledger.bench.dims
        make = {"asha": baselines.ASHA, "bohb": baselines.BOHB}[kind]
        scheduler = make(
            config_space={n: uniform(0.0, 1.0) for n in names(dims)},
            metric="value",
            time_attr="epoch",
            max_t=EPOCHS,
            do_minimize=True,
            random_seed=seed,
            grace_period=1,
            reduction_factor=ETA,
        )
        trial_id = 0
        with contextlib.suppress(BudgetSpent), _quiet("syne_tune"):
            while ledger.left:
                suggestion = scheduler.suggest()
                assert suggestion is not None and suggestion.config is not None
                trial = Trial(trial_id, suggestion.config, datetime.datetime.now())
                scheduler.on_trial_add(trial)
                x = point(suggestion.config, dims)
                for epoch in range(1, EPOCHS + 1):
                    result = {"value": ledger.evaluate(x, epoch * EVERY, trial_id), "epoch": epoch}
                    if epoch == EPOCHS:
                        scheduler.on_trial_complete(trial, result)
                    elif scheduler.on_trial_result(trial, result) != SchedulerDecision.CONTINUE:
                        break
                trial_id += 1

    return run


def ray_tune_asha(ledger: Ledger, seed: int) -> None:
    """Ray Tune's `Tuner` with `ASHAScheduler` (grace period 5, max 100, reduction factor 3)
    and `OptunaSearch` (seeded), one trial at a time; the ledger is kept by a stopper in the
    driver, which sees every report in order and stops the study when the budget is spent."""
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    if not ray.is_initialized():
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    dims = ledger.bench.dims
    search = ConcurrencyLimiter(OptunaSearch(metric="value", mode="min", seed=seed), 1)
    scheduler = ASHAScheduler(time_attr="epoch", max_t=EPOCHS, grace_period=1, reduction_factor=ETA)
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as out:
        tuner = tune.Tuner(
            _ray_trainable,
            param_space={
                **{n: tune.uniform(0.0, 1.0) for n in names(dims)},
                "benchmark": ledger.bench.name,
            },
            tune_config=tune.TuneConfig(
                metric="value", mode="min", search_alg=search, scheduler=scheduler,
                num_samples=100_000, reuse_actors=True,
            ),
            run_config=tune.RunConfig(stop=_ray_ledger(ledger), storage_path=out, verbose=0),
        )  # fmt: skip
        tuner.fit()


def _ray_trainable(config: dict[str, object]) -> None:
    """A trial: its fidelities in order (the driver's ledger books the same values)."""
    from ray import tune

    from app.bench.studies.mf.hartmann import benchmark

    bench = benchmark(str(config["benchmark"]))
    x = point(config, bench.dims)
    for epoch in range(1, EPOCHS + 1):
        tune.report({"value": bench.value(x, epoch * EVERY), "epoch": epoch})


def _ray_ledger(ledger: Ledger) -> object:
    """A Ray Tune stopper, in the driver, that books each report in the ledger as it comes and
    stops the study once the budget is spent."""
    from ray import tune

    class Booked(tune.Stopper):
        def __call__(self, trial_id: str, result: dict[str, object]) -> bool:
            config = result["config"]
            assert isinstance(config, dict)
            epoch = int(str(result["epoch"]))
            try:
                ledger.evaluate(point(config, ledger.bench.dims), epoch * EVERY, trial_id)
            except BudgetSpent:
                return True
            return False

        def stop_all(self) -> bool:
            return not ledger.left

    return Booked()


@contextlib.contextmanager
def _quiet(logger: str) -> Iterator[None]:
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


# name -> (what runs, the package whose version the table's header gives)
PEERS: dict[str, tuple[Run, str]] = {
    "optuna-tpe-hyperband": (optuna_hyperband, "optuna"),
    "smac3-mf": (smac_multi_fidelity, "smac"),
    "dehb": (dehb, "dehb"),
    "syne-tune-asha": (syne_tune("asha"), "syne-tune"),
    "syne-tune-bohb": (syne_tune("bohb"), "syne-tune"),
    "ray-tune-asha-optuna": (ray_tune_asha, "ray"),
}
