"""This sweeper's contender: its default study (`hpo.*` defaults: univariate TPE with a
random start-up of a quarter of the budget, successive halving with its rungs from the study's
axis, a budget of full trials' worth) driving an app of its own, in this process, as a user's
`@hydra.main` app runs under `-m`: a Hydra multirun with this sweeper and the basic launcher.

The app reports the benchmark every 5 fidelity steps up to 100 (`hpo.report_every=5`,
`hpo.max_resource=100`) through the trial reporter (`reporter_for_job`), and stops when the
pruner says so, a trial being one continuing run in the ledger. The study's wall includes
everything the sweeper does (its journal storage, results, report.html).
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from app.bench.studies.mf.hartmann import MAX_FIDELITY
from app.bench.studies.mf.peers import names
from app.bench.studies.mf.protocol import BUDGET_TRIALS, EVERY, BudgetSpent, Ledger

APP = "mf_bench_app"  # the app's config in Hydra's ConfigStore
_LEDGER: list[Ledger] = []  # the running study's ledger: the app's jobs run in this process


@dataclass
class AppConfig:
    """The app's own config: the point (x0..x5, the benchmark's first `dims` searched)."""

    x: dict[str, float] = field(default_factory=lambda: dict.fromkeys(names(6), 0.5))


# This sweeper's options measured beside its default (`--optimizers hydratrain-<name>`): the
# overrides each adds to the default study, to decide a default from the suite.
VARIANTS: dict[str, list[str]] = {
    "default": [],
    "rung5": ["+hpo.pruner_args={min_resource:5}"],  # the first rung at the first report
    "bootstrap0": ["+hpo.pruner_args={bootstrap_count:0}"],  # Optuna's own
    "hyperband": ["+hpo.pruner=hyperband"],  # brackets from 5 to 100
    "asha": ["+hpo.pruner=asha"],  # pausing, promoted
    "multivariate": ["+hpo.sampler_args={multivariate:true}"],  # Optuna 5's TPE default
}


def hydratrain(variant: str) -> Callable[[Ledger, int], None]:
    """This sweeper's study with `VARIANTS[variant]`'s overrides."""
    extra = VARIANTS[variant]

    def run(ledger: Ledger, seed: int) -> None:
        _study(ledger, seed, extra)

    return run


def _study(ledger: Ledger, seed: int, extra: list[str]) -> None:
    """The study of this sweeper, seeded, on `ledger`'s benchmark."""
    with tempfile.TemporaryDirectory(prefix="bench-mf-sweep-") as tmp, _running(ledger):
        space = [f"x.{n}=interval(0.0,1.0)" for n in names(ledger.bench.dims)]
        _multirun(
            [
                "hydra/sweeper=hydratrain_optuna",
                "hydra/hydra_logging=disabled",
                "hydra/job_logging=disabled",
                f"hydra.sweep.dir={tmp}/sweep",
                "hydra.job.chdir=false",
                "hydra.output_subdir=null",
                f"+hpo.budget_trials={BUDGET_TRIALS}",
                f"+hpo.max_resource={MAX_FIDELITY}",
                f"+hpo.report_every={EVERY}",
                f"+hpo.seed={seed}",
                "+hpo.study_name=mf",
                f"+hpo.storage={tmp}/study.journal",
                "+hpo.tensorboard=false",
                *space,
                *extra,
            ]
        )


@contextlib.contextmanager
def _running(ledger: Ledger) -> Iterator[None]:
    _LEDGER.append(ledger)
    try:
        yield
    finally:
        _LEDGER.pop()


def _multirun(overrides: list[str]) -> None:
    """`python <app> -m <overrides>`, in this process."""
    import hydra
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra

    ConfigStore.instance().store(name=APP, node=AppConfig)
    main = hydra.main(version_base=None, config_path=None, config_name=APP)(_trial)
    GlobalHydra.instance().clear()
    argv = sys.argv
    sys.argv = ["mf_bench_app", "-m", *overrides]
    try:
        main()
    finally:
        sys.argv = argv
        GlobalHydra.instance().clear()


def _trial(cfg: object) -> float:
    """One trial of the app: the benchmark at 5, 10, ..., 100 until the pruner stops it."""
    import optuna

    from hydra_plugins.hydratrain_optuna_sweeper.reporter import reporter_for_job

    ledger = _LEDGER[-1]
    rep = reporter_for_job(cfg)
    x = tuple(float(cfg.x[n]) for n in names(ledger.bench.dims))  # type: ignore[attr-defined]
    trial = cfg.hpo.trial_number  # type: ignore[attr-defined]
    value = float("nan")
    for z in range(EVERY, MAX_FIDELITY + 1, EVERY):
        try:
            value = ledger.evaluate(x, z, trial=trial)
        except BudgetSpent:  # the compute is spent: this trial goes no further
            raise optuna.TrialPruned() from None
        if rep.report(z, {"val_loss": value}):
            raise optuna.TrialPruned()
    return value
