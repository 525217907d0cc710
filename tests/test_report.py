"""A study's report (report.html): Optuna's trials read as records (how each ended, its line,
its worker, its cost), the page built from them, and `python -m app.report` on any study.
The sweeps that write one, and the page in a real browser: test_report_sweeps.py."""

from __future__ import annotations

import datetime as dt
import logging
import warnings
from pathlib import Path

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from app.report import main as report_main
from app.studies.report import figures
from app.studies.report.page import PLOTS
from app.studies.report.tables import savings
from hydra_plugins.hydratrain_optuna_sweeper._pruners._asha import PAUSED
from hydra_plugins.hydratrain_optuna_sweeper._pruners._lineage import PROMOTED_FROM, ROOT
from hydra_plugins.hydratrain_optuna_sweeper._report import _records as _report
from hydra_plugins.hydratrain_optuna_sweeper._report._records import (
    describe,
    rerun_command,
    study_record,
    write_sweep_report,
)

pytestmark = pytest.mark.integration

optuna.logging.set_verbosity(optuna.logging.WARNING)
T0 = dt.datetime(2026, 1, 1, 12, 0, 0)
LR = {"lr": FloatDistribution(1e-4, 1e-1, log=True)}


def _trial(state, lr, curve, *, reason=None, system=None, worker=0, start=0, seconds=1.0, **user):
    attrs = {"worker": worker, "devices": str(worker), "device_seconds": seconds, **user}
    if reason:
        attrs["reason"] = reason
    trial = create_trial(
        state=state,
        value=curve[max(curve)] if curve and state != TrialState.FAIL else None,
        params={"lr": lr},
        distributions=LR,
        intermediate_values=curve,
        user_attrs=attrs,
        system_attrs=system or {},
    )
    trial.datetime_start = T0 + dt.timedelta(seconds=start)
    trial.datetime_complete = T0 + dt.timedelta(seconds=start + 10)
    return trial


def _curve(last: int, lr: float) -> dict[int, float]:
    return {s: 2.0 + abs(lr - 3e-3) + 3.0 / (1 + s) for s in range(0, last + 1, 5)}


def _sweeper_study() -> optuna.Study:
    """Every way a trial of this sweeper ends, on two workers; trial 5 promotes trial 0."""
    study = optuna.create_study(study_name="mixed")
    describe(study, ["final_val_loss"], "samples", 20)
    add = study.add_trial
    add(_trial(TrialState.PRUNED, 3e-3, _curve(5, 3e-3), reason="paused", system={PAUSED: 5}))
    add(_trial(TrialState.PRUNED, 1e-1, _curve(5, 1e-1), reason="pruned", worker=1))
    add(_trial(TrialState.PRUNED, 2e-3, {}, reason="oom", start=10, seconds=0.0))
    add(_trial(TrialState.FAIL, 5e-2, _curve(10, 5e-2), reason="diverged", worker=1, start=10))
    add(_trial(TrialState.FAIL, 1e-2, {}, reason="error", start=20, seconds=0.0))
    promoted = {ROOT: 0, PROMOTED_FROM: 0}
    resumed = {s: v for s, v in _curve(20, 3e-3).items() if s > 5}
    add(_trial(TrialState.COMPLETE, 3e-3, resumed, system=promoted, start=30))
    grew = [{"step": 0, "samples": 0, "batch": 4}, {"step": 2, "samples": 8, "batch": 8}]
    add(
        _trial(
            TrialState.COMPLETE,
            1e-3,
            _curve(20, 1e-3),
            worker=1,
            start=20,
            seconds=4.0,
            batch_schedule=grew,
        )
    )
    add(_trial(TrialState.FAIL, 1e-3, {}, reason="duplicate"))
    return study


def test_each_ending_the_sweeper_records_is_read_and_a_promoted_line_is_one_curve():
    record = study_record(_sweeper_study(), "memory")
    assert [t.ending for t in record.trials] == [
        "paused", "pruned", "oom", "diverged", "failed", "complete", "complete", "failed"
    ]  # fmt: skip
    assert [t.number for t in record.ran] == [0, 1, 2, 3, 4, 5, 6]  # the duplicate never ran
    lines = {line.root.number: line for line in record.lines()}
    assert sorted(lines) == [0, 1, 2, 3, 4, 6]
    paused_then_done = lines[0]
    assert paused_then_done.ending == "promoted" and paused_then_done.pauses == [5]
    assert [x for x, _ in paused_then_done.curve] == [0, 5, 10, 15, 20]  # both trials' reports
    assert record.unit == "samples" and record.budget == 20
    assert record.best() is not None and record.best().number == 5
    assert record.metrics == ("final_val_loss",)


def test_the_curves_are_drawn_one_trace_per_ending_and_the_timeline_one_row_per_worker():
    study = _sweeper_study()
    record = study_record(study, "memory")
    curves = figures.curves(record, study)
    names = {trace.name for trace in curves.data}
    assert names == {"promoted (1)", "pruned (1)", "paused here", "diverged (1)", "complete (1)"}
    timeline = figures.timeline(record, study)
    rows = {row for trace in timeline.data for row in trace.y}
    assert rows == {"worker 0 (GPU 0)", "worker 1 (GPU 1)"}
    # one bar per trial that ran: trial 7 (a surplus trial failed unrun) is not one
    bars = sorted(bar for trace in timeline.data for bar in trace.text)
    assert bars == [f"trial {n}" for n in range(7)]


def test_an_adaptive_trials_batch_is_drawn_over_the_data_it_saw():
    """training.batch_schedule=adaptive: a step at each doubling, on to where the trial ended
    (a completed trial: the budget; a pruned one: its last report); a fixed batch is not drawn."""
    study = _sweeper_study()
    grew = [{"step": 0, "samples": 0, "batch": 8}, {"step": 1, "samples": 8, "batch": 16}]
    study.add_trial(_trial(TrialState.PRUNED, 2e-3, _curve(10, 2e-3), batch_schedule=grew))
    record = study_record(study, "memory")
    assert record.trials[6].batches == ((0, 4), (8, 8)) and record.trials[5].batches == ()
    fig = figures.batches(record, study)
    drawn = {trace.name: (list(trace.x), list(trace.y)) for trace in fig.data}
    assert drawn == {
        "trial 6 (complete)": ([0, 8, 20], [4, 8, 8]),
        "trial 8 (pruned)": ([0, 8, 10], [8, 16, 16]),
    }
    fixed = optuna.create_study()
    fixed.add_trial(_trial(TrialState.COMPLETE, 1e-3, _curve(20, 1e-3)))
    with pytest.raises(figures.NotDrawn, match="batch_schedule=adaptive"):
        figures.batches(study_record(fixed, "memory"), fixed)


def test_what_pruning_saved_is_counted_at_each_stopped_lines_own_rate():
    """Trial 1 (pruned at 5 of 20, 1 s) would have cost 4 s: 3 s and 15 samples saved. A
    divergence or an OOM is not the pruner's saving; the promoted line ran on to the end."""
    s = savings(study_record(_sweeper_study(), "memory"))
    assert (s.lines, s.axis_saved, s.seconds_saved) == (1, 15, pytest.approx(3.0))


def test_the_rerun_command_leaves_out_what_made_the_run_a_trial(tmp_path):
    hydra = tmp_path / ".hydra"
    hydra.mkdir()
    (hydra / "overrides.yaml").write_text(
        "- hpo=optuna\n- training.lr=0.003\n- data.path=/my data\n- training.resume=/x\n"
        "- ++hpo.study_name=t\n- ++hpo.trial_number=4\n"
        "- tracking.mlflow.tracking_uri=http://me:s3cret@mlflow:5000\n"
    )
    expected = (
        "python -m app.train training.lr=0.003 'data.path=/my data' "
        "tracking.mlflow.tracking_uri=http://me:***@mlflow:5000"
    )
    assert rerun_command(str(tmp_path)) == expected
    assert rerun_command(str(tmp_path / "gone")) is None


def test_the_page_has_every_section_and_loads_nothing_from_elsewhere(tmp_path):
    study = _sweeper_study()
    page = _report.write_report(study_record(study, "memory"), study, tmp_path)
    html = page.read_text()
    for plot in PLOTS:
        if plot.id != "pareto":
            assert f"<section id='{plot.id}' data-drawn=\"true\">" in html, plot.id
    assert "<section id='pareto'" not in html  # one objective
    for section in ("best", "workers", "spent", "plan"):
        assert f"<section id='{section}'>" in html
    assert "src='http" not in html and 'src="http' not in html and "cdn.plot.ly/plotly" not in html
    assert {p.name for p in tmp_path.iterdir()} == {
        "report.html", "learning_curves.png", "optimization_history.png", "param_importances.png"
    }  # fmt: skip


def test_a_report_that_cannot_be_written_is_one_warning_and_never_fails_the_sweep(
    tmp_path, monkeypatch, caplog
):
    def broken(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(_report, "write_report", broken)
    with caplog.at_level(logging.WARNING):
        assert write_sweep_report(_sweeper_study(), "memory", str(tmp_path)) is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == ["The study's report was not written: OSError: No space left on device"]


def _plain_study(path: Path) -> None:
    """A study written by plain Optuna: no attribute of this project on it."""
    study = optuna.create_study(study_name="plain", storage=f"sqlite:///{path}")

    def objective(trial: optuna.Trial) -> float:
        x, y = trial.suggest_float("x", -3, 3), trial.suggest_int("y", 0, 4)
        if x > 2.5:
            raise ValueError("a failure of its own")
        for step in range(4):
            trial.report((x - 1) ** 2 + y / (step + 1), step)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return (x - 1) ** 2 + y / 4

    study.optimize(objective, n_trials=20, catch=(ValueError,))


def test_app_report_draws_a_study_of_plain_optuna(tmp_path, capsys):
    _plain_study(tmp_path / "plain.db")
    out = tmp_path / "report"
    assert report_main(["--storage", f"sqlite:///{tmp_path}/plain.db", "--out", str(out)]) == 0
    assert capsys.readouterr().out == f"Report in {out / 'report.html'}\n"
    html = (out / "report.html").read_text()
    for plot in ("history", "curves", "importances", "parallel", "slices", "timeline"):
        assert f"<section id='{plot}' data-drawn=\"true\">" in html, plot
    assert "Not drawn: no trial recorded its device-seconds" in html  # cost: nothing recorded


def test_app_report_takes_a_warm_started_study_alone_whatever_its_name(tmp_path, capsys):
    """Its warm start's claim (`<study>:hpo:warm_start`) is not a study to report, even where
    the study's own name has a colon."""
    storage = f"sqlite:///{tmp_path}/exp.db"
    study = optuna.create_study(study_name="exp:1", storage=storage)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    optuna.create_study(study_name="exp:1:hpo:warm_start", storage=storage)
    assert report_main(["--storage", storage, "--out", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "report.html").is_file()


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--storage", "none.journal"], "error: --storage='none.journal': no such journal file"),
        (["--study", "other"], "error: --study='other' is not in the storage (its studies: plain)"),
    ],
)
def test_app_report_refuses_a_storage_or_study_it_cannot_read_in_one_line(
    tmp_path, capsys, args, line
):
    _plain_study(tmp_path / "plain.db")
    storage = ["--storage", f"sqlite:///{tmp_path}/plain.db"]
    assert report_main([*(storage if args[0] == "--study" else []), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(line) and err.count("\n") == 1


def test_app_report_gives_each_study_of_a_folder_its_own_report(tmp_path, monkeypatch):
    """Journals share a folder (outputs/hpo/*.journal): without --out, each study's report goes
    to <the journal's folder>/<study>/, and a database's to ./<study>/, so none replaces
    another's."""
    from hydra_plugins.hydratrain_optuna_sweeper._study._storage import journal

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "journals" / "study.journal"
    path.parent.mkdir()
    for name in ("a", "b"):
        study = optuna.create_study(study_name=name, storage=journal(str(path)))
        study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
        assert report_main(["--storage", str(path), "--study", name]) == 0
    for name in ("a", "b"):
        assert f"<title>Study {name}</title>" in (path.parent / name / "report.html").read_text()
    study = optuna.create_study(study_name="c", storage=f"sqlite:///{tmp_path}/c.db")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    assert report_main(["--storage", f"sqlite:///{tmp_path}/c.db"]) == 0
    assert (tmp_path / "c" / "report.html").is_file()


def test_how_a_budget_in_trials_worth_was_spent_is_in_the_report_as_the_sweeper_counts_it():
    """Lines: the promoted one and trial 6 ran to the end (1 each), trial 1 was pruned at 5 of
    20 (a quarter), the diverged one ran 10 (a half), the OOM and the error none: 2.75."""
    from app.studies.report.tables import cost_table
    from hydra_plugins.hydratrain_optuna_sweeper._study._cost import BUDGET_TRIALS, trials_worth

    study = _sweeper_study()
    study.set_user_attr(BUDGET_TRIALS, 3.0)
    record = study_record(study, "memory")
    assert record.budget_trials == 3.0
    table = cost_table(record)
    for row in (
        "budget: full trials&#x27; worth of training (hpo.budget_trials)</td><td>3</td>",
        "spent: full trials&#x27; worth</td><td>2.75</td>",
        "configurations it bought (lines of trials)</td><td>6</td>",
        "of them trained to the end</td><td>2</td>",
    ):
        assert row in table
    assert trials_worth(study.get_trials(), 20) == pytest.approx(2.75)  # the sweeper's count


def test_the_plots_of_a_warm_started_study_draw_its_own_trials_under_its_metric_names():
    """Optuna's plots get a copy of the study without the trials it borrowed (hpo.warm_start),
    which keeps the names of its objectives."""
    from app.studies.report import own_trials
    from hydra_plugins.hydratrain_optuna_sweeper._pruners._learned import BORROWED

    study = optuna.create_study(directions=["minimize", "maximize"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # experimental in Optuna 4
        study.set_metric_names(["final_val_loss", "tokens_per_sec"])
    study.add_trial(create_trial(values=[1.0, 2.0], user_attrs={"reason": BORROWED}))
    study.tell(study.ask(), [0.5, 3.0])
    own = own_trials(study, _report.study_record(study, "memory"))
    assert [t.values for t in own.get_trials()] == [[0.5, 3.0]]
    assert own.metric_names == ["final_val_loss", "tokens_per_sec"]
