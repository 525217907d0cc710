"""Pruning with several objectives: the pruner judges hpo.report_metric through the pruning
companion study (`_companion.py`), and the Pareto front still comes from the main study's
completed trials alone."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from omegaconf import OmegaConf
from optuna.trial import TrialState

from app.hpo import build_reporter
from hydra_plugins.hydratrain_optuna_sweeper._pruners._companion import (
    MAIN_TRIAL,
    REPORT_TRIAL,
    Judge,
    companion_name,
    open_companion,
)
from hydra_plugins.hydratrain_optuna_sweeper._pruners._kind import build_pruner
from hydra_plugins.hydratrain_optuna_sweeper._study._storage import journal
from tests import procs

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
FAKE = [*procs.FAKE, "-m", "hpo=optuna"]
REPORTER = "hydra_plugins.hydratrain_optuna_sweeper.reporter.reporter_for_job"
optuna.logging.set_verbosity(optuna.logging.WARNING)
MEDIAN = {"n_startup_trials": 3, "n_warmup_steps": 1}


def _two_objective_study(tmp_path: Path) -> optuna.Study:
    return optuna.create_study(
        study_name="m",
        storage=journal(str(tmp_path / "s.journal")),
        directions=["minimize", "maximize"],
    )


def test_a_jobs_reporter_judges_the_report_metric_in_the_companion(tmp_path):
    """The path of a job in another process: cfg.hpo and the storage, nothing else."""
    study = _two_objective_study(tmp_path)
    pruner = build_pruner("median", MEDIAN, 1)
    judge = Judge(study, open_companion(study, "val_loss", "minimize", pruner))
    for value in (1.0, 1.1, 1.2):  # three completed trials, reported every 5 steps
        trial = study.ask()
        twin = judge.pair(trial)
        assert twin is not None
        for step in (5, 10):
            twin.report(value, step)
        study.tell(trial, [value, 100.0])
        judge.settle(trial, TrialState.COMPLETE)
    fair, hopeless = study.ask(), study.ask()
    for trial in (fair, hopeless):
        judge.pair(trial)
    assert _reporter(tmp_path, fair.number).report(5, {"val_loss": 0.9}) is False  # goes on
    assert _reporter(tmp_path, hopeless.number).report(5, {"val_loss": 9.0}) is True  # pruned
    companion = optuna.load_study(
        study_name=companion_name("m", "val_loss"), storage=study._storage
    )
    twins = companion.get_trials()
    assert [t.state for t in twins[:3]] == [TrialState.COMPLETE] * 3
    assert [t.value for t in twins[:3]] == [1.0, 1.1, 1.2]  # their last reports
    assert twins[4].intermediate_values == {5: 9.0}
    assert twins[4].system_attrs[MAIN_TRIAL] == hopeless.number
    assert study.get_trials()[4].system_attrs[REPORT_TRIAL] == twins[4].number
    assert study.get_trials()[4].intermediate_values == {}  # the main trial: untouched


def _reporter(tmp_path: Path, number: int):
    hpo = {
        "study_name": "m",
        "storage": str(tmp_path / "s.journal"),
        "trial_number": number,
        "reporter": REPORTER,
        "metric": ["final_val_loss", "tokens_per_sec"],
        "direction": ["minimize", "maximize"],
        "pruner": "median",
        "pruner_args": MEDIAN,
    }
    cfg = OmegaConf.create({"hpo": hpo})
    return build_reporter(cfg.hpo, cfg)


def _pareto(points: dict[int, list[float]]) -> set[int]:
    """Numbers of the points no other dominates (loss down, tokens/s up)."""

    def dominates(a: list[float], b: list[float]) -> bool:
        return a[0] <= b[0] and a[1] >= b[1] and (a[0] < b[0] or a[1] > b[1])

    return {n for n, p in points.items() if not any(dominates(q, p) for q in points.values())}


@pytest.mark.slow
def test_a_two_objective_study_prunes_a_hopeless_trial_and_keeps_its_pareto_front(tmp_path):
    """Three fair trials complete (the median pruner's start-up), then a hopeless one (lr far
    from the fake's best) is pruned on val_loss; the front is the completed trials' own."""
    trials = [("3e-3", 16), ("2e-3", 64), ("5e-3", 32), ("1e-4", 64), ("2.5e-3", 32)]
    enqueue = ",".join(
        f"{{training.lr:{lr},training.effective_batch_size:{b}}}" for lr, b in trials
    )
    args = [
        f"hpo.n_trials={len(trials)}",
        "hpo.study_name=t",
        f"hpo.storage={tmp_path}/study.journal",
        f"hydra.sweep.dir={tmp_path}/multirun",
        "hpo.tensorboard=false",
        "hpo.metric=[final_val_loss,tokens_per_sec]",
        "hpo.direction=[minimize,maximize]",
        "hpo.sampler=nsgaii",
        "hpo.pruner=median",
        "++hpo.pruner_args={n_startup_trials:3,n_warmup_steps:1}",
        f"hpo.enqueue=[{enqueue}]",
    ]
    procs.run([*FAKE, *args], env=procs.environment(out=tmp_path), timeout=240, check=True)
    storage = journal(str(tmp_path / "study.journal"))
    main = optuna.load_study(study_name="t", storage=storage).get_trials()
    assert [t.state for t in main] == [TrialState.COMPLETE] * 3 + [TrialState.PRUNED] + [
        TrialState.COMPLETE
    ]
    assert main[3].user_attrs["reason"] == "pruned"
    companion = optuna.load_study(study_name="t:val_loss", storage=storage).get_trials()
    assert [t.state for t in companion] == [t.state for t in main]
    results = OmegaConf.load(tmp_path / "multirun" / "optimization_results.yaml")
    complete = {t.number: list(t.values) for t in main if t.state == TrialState.COMPLETE}
    assert {s.number for s in results.solutions} == _pareto(complete)
    _assert_the_report_draws_the_front_and_the_companions_curves(tmp_path)


def _assert_the_report_draws_the_front_and_the_companions_curves(tmp_path: Path) -> None:
    """The report of a two-objective study: its Pareto front, no single-objective history, and
    the learning curves the companion study took (the main trials report nothing)."""
    from app.studies.report.figures import curves
    from hydra_plugins.hydratrain_optuna_sweeper._report._records import study_record

    html = (tmp_path / "multirun" / "report.html").read_text()
    assert "<section id='pareto' data-drawn=\"true\">" in html
    assert "<section id='history'" not in html
    study = optuna.load_study(study_name="t", storage=journal(str(tmp_path / "study.journal")))
    record = study_record(study, "journal")
    assert record.metrics == ("final_val_loss", "tokens_per_sec")
    assert [len(t.curve) > 0 for t in record.trials] == [True] * 5
    assert record.trials[3].ending == "pruned"
    assert {trace.name for trace in curves(record, study).data} == {"complete (4)", "pruned (1)"}
