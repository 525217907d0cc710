"""`python -m app.bench --hpo-peers`: when a study came within 1 % of the reference's best, the
goals judged from it, and the Trainer study drawing the sweeper's configurations."""

from __future__ import annotations

import json
import sys
import threading
import time

import optuna
import pytest

from app.bench.studies.hf_study import ARGUMENT, _space, _suggest
from app.bench.studies.hpo_peers import (
    _same_configurations,
    goals,
    peers_table,
    reach_seconds,
    reach_steps,
)

pytestmark = pytest.mark.unit

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _row(number: int, value: float | None, end: float, state: str = "COMPLETE", **params):
    return {"number": number, "state": state, "value": value, "end": end, "steps": 10,
            "params": params or {"x": number}}  # fmt: skip


def _study(wall: float, rows: list[dict], best: float | None = None) -> dict:
    done = [r["value"] for r in rows if r["state"] == "COMPLETE"]
    return {
        "wall_s": wall,
        "started_at": 1000.0,
        "trials": rows,
        "states": {"COMPLETE": len(done)},
        "optimizer_steps": 10 * len(rows),
        "best_value": best if best is not None else (min(done) if done else None),
    }


def test_reach_is_the_first_completed_trial_within_one_percent_of_the_best():
    rows = [
        _row(0, 1.10, 1010.0),
        _row(1, 1.009, 1030.0),  # within 1 % of 1.0: the first
        _row(2, 1.0, 1020.0, state="PRUNED"),  # a pruned trial's last report does not count
        _row(3, 1.0, 1050.0),
    ]
    assert reach_seconds(_study(60, rows), best=1.0) == pytest.approx(30.0)
    assert reach_steps(_study(60, rows), best=1.0) == 30  # trials 0-2 had ended by then
    assert reach_seconds(_study(60, rows[:1]), best=1.0) is None


def test_goals_say_met_or_missed_with_their_figures():
    none = _study(300, [_row(0, 1.0, 1300.0)])
    default = _study(120, [_row(0, 1.0, 1090.0)])
    trainer = _study(400, [_row(0, 1.0, 1200.0)])
    asha = _study(100, [_row(0, 1.05, 1080.0)])
    studies = {"none": none, "default": default, "trainer": trainer, "asha": asha}
    for s in studies.values():
        s["reach_s"] = reach_seconds(s, 1.0)
    g = goals(studies)
    assert g["default_within_third_of_unpruned_wall"]["met"]  # 90 <= 300 / 3
    assert g["default_under_half_of_trainer"]["met"]  # 90 < 200 / 2
    assert not g["asha_within_1pct_of_the_best"]["met"]  # 1.05 > 1.0 * 1.01
    assert g["asha_steps_within_default_plus_20pct"]["met"]  # 10 <= 10 * 1.2
    report = {"reference_best": 1.0, "studies": studies, "same_configurations": {}, "goals": g}
    table = peers_table(report)
    assert "| default | complete: 1 | 120 | 0 | 10 | 1.0000 | 90 | 0.30 | 10 |" in table
    assert "goal asha_within_1pct_of_the_best: MISSED" in table
    asha["best_value"], asha["optimizer_steps"] = 1.009, 13
    g = goals(studies)
    assert g["asha_within_1pct_of_the_best"]["met"]
    assert not g["asha_steps_within_default_plus_20pct"]["met"]  # 13 > 12


def test_configurations_are_compared_line_by_line_in_order():
    ref = [_row(i, 1.0, 1000.0, lr=0.1 * (i + 1)) for i in range(3)]
    copy = _row(3, 1.0, 1000.0, lr=0.1)  # a promoted copy repeats trial 0's
    other = [_row(0, 1.0, 1000.0, lr=0.3), *ref[1:]]
    studies = {"none": _study(1, ref), "asha": _study(1, [*ref, copy]), "x": _study(1, other)}
    assert _same_configurations(studies) == {"none": True, "asha": True, "x": False}


def test_the_trainer_study_draws_the_sweepers_configurations_under_its_own_names():
    from omegaconf import OmegaConf

    from hydra_plugins.hydratrain_optuna_sweeper.pruning import suggest

    params = OmegaConf.create(
        {
            "training.effective_batch_size": "choice(8, 16, 32, 64)",
            "training.lr": "tag(log, interval(3e-4, 3e-2))",
            "training.weight_decay": "interval(0.0, 0.2)",
            "training.warmup_steps": "choice(0, 10, 30)",
        }
    )
    space = _space(params)
    ours = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=7))
    theirs = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=7))
    for _ in range(5):
        trial = ours.ask()
        for name, dist in space.items():  # as the sweeper's worker does
            suggest(trial, name, dist)
        drawn = trial.params
        peer = _suggest(theirs.ask(), space, micro=8)
        assert peer == {
            ARGUMENT["training.effective_batch_size"]: drawn["training.effective_batch_size"] // 8,
            ARGUMENT["training.lr"]: drawn["training.lr"],
            ARGUMENT["training.weight_decay"]: drawn["training.weight_decay"],
            ARGUMENT["training.warmup_steps"]: drawn["training.warmup_steps"],
        }


# `python -m app.bench --default-study`


def test_the_default_study_goals_follow_the_issue_with_their_figures():
    from app.bench.studies.default_study import goals as default_goals

    none = {**_study(900.0, [_row(0, 1.00, 1800.0)]), "cpu_s": 800.0}  # a loaded machine
    fast = _study(700.0, [_row(0, 1.20, 1100.0), _row(1, 1.005, 1250.0), _row(2, 0.99, 1600.0)])
    slow_peer = _study(900.0, [_row(0, 1.008, 1700.0)])
    g = default_goals({"none": none, "default": fast, "trainer": slow_peer}, 0.995, 0.99)
    assert g["a_pick_within_1pct_of_the_grid"]["met"]  # 0.995 <= 0.99 * 1.01
    assert g["b_within_1pct_in_a_quarter_of_the_unpruned_wall"] == {
        "reach_s": 250.0, "limit_s": 225.0, "share_of_wall": 250.0 / 900.0,
        "share_of_cpu": 250.0 / 800.0, "met": False}  # fmt: skip
    assert g["c_as_good_as_the_unpruned_study"]["met"]  # 0.99 <= 1.00
    assert g["d_under_half_of_the_trainer"]["met"]  # 250 < 700 / 2
    quick = _study(700.0, [_row(0, 1.005, 1225.0)])  # 225 s: a quarter of the wall
    g = default_goals({"none": none, "default": quick, "trainer": slow_peer}, 0.995, 0.99)
    assert g["b_within_1pct_in_a_quarter_of_the_unpruned_wall"]["met"]
    late = _study(700.0, [_row(0, 1.005, 1400.0)])
    g = default_goals({"none": none, "default": late, "trainer": slow_peer}, 1.2, 0.99)
    assert [goal["met"] for goal in g.values()] == [False, False, False, False]


def test_a_default_study_run_takes_only_the_grid_and_the_trainer_from_an_earlier_log():
    """Those two do not depend on the sweeper's sampler or pruner; the sweeper's own studies of
    the earlier run must run again under the new settings, so they are never taken."""
    from app.bench.studies.default_study import earlier_studies

    grid, trainer = _study(10.0, [_row(0, 0.5, 1.0)]), _study(20.0, [_row(0, 0.6, 2.0)])
    log = "\n".join([
        "grid: " + json.dumps(grid),
        "seed 0 none: " + json.dumps(_study(30.0, [])),
        "seed 0 default: " + json.dumps(_study(40.0, [])),
        "seed 1 trainer: " + json.dumps(trainer),
        "[W] a warning line: {not json}",
    ])  # fmt: skip
    assert earlier_studies(log) == {"grid": grid, "seed 1 trainer": trainer}
    unpruned = earlier_studies(log, unpruned=True)
    assert unpruned == {"grid": grid, "seed 0 none": _study(30.0, []), "seed 1 trainer": trainer}


def test_the_unpruned_study_is_reused_only_for_a_change_of_the_pruner():
    from app.bench.studies.default_study import check_pruner_only

    check_pruner_only(["hpo.pruner=asha", "++hpo.pruner_args={reduction_factor:4}"])
    with pytest.raises(SystemExit, match=r"'hpo.sampler_args=\{n_startup_trials:3\}' would"):
        check_pruner_only(["hpo.pruner=asha", "hpo.sampler_args={n_startup_trials:3}"])


def test_a_trainer_trial_under_a_data_budget_trains_the_sweepers_data_at_its_batch():
    """The same samples as the sweeper's run of that batch: its steps, warm-up and evaluation
    interval in its own steps, the whole batch per step."""
    from omegaconf import OmegaConf

    from app.bench.studies.hf_study import _per_trial
    from app.config.training import TrainingConfig

    params = {
        "training.effective_batch_size": "choice(64)",
        "training.lr": "choice(0.003)",
        "training.warmup_steps": "choice(20)",
    }
    space = _space(OmegaConf.create(params))
    trial = optuna.create_study().ask()
    t = TrainingConfig(reference_batch=32, eval_every=50)
    args = _per_trial(trial, space, 9600, t)
    assert args == {
        "learning_rate": 0.003,
        "per_device_train_batch_size": 64,
        "gradient_accumulation_steps": 1,
        "max_steps": 150,  # 9,600 samples
        "warmup_steps": 10,  # 20 steps of 32 = 640 samples
        "eval_steps": 25,  # every 1,600 samples, as the sweeper's run evaluates
    }
    assert trial.params["training.effective_batch_size"] == 64  # recorded under our names


# `python -m app.bench --sampler-choice`


def test_a_samplers_anytime_best_and_its_gap_to_each_seeds_best():
    from app.bench.studies.sampler_choice import _regret, _steps, best_by

    study = _study(100.0, [_row(0, 2.0, 1010.0), _row(1, None, 1020.0, "PRUNED"),
                           _row(2, 1.5, 1030.0)])  # fmt: skip
    for t, batch in zip(study["trials"], (8, 8, 16), strict=True):
        t["params"] = {"training.effective_batch_size": batch}
    steps = _steps(study)  # 10 steps each: 80, 80 and 160 samples
    assert [(s["samples"], s["value"]) for s in steps] == [(80, 2.0), (160, None), (320, 1.5)]
    assert best_by(steps, 160) == 2.0 and best_by(steps, 320) == 1.5

    def run(arm: str, seed: int, best: float, half: float | None) -> dict:
        return {"study": "s", "arm": arm, "seed": seed, "best_value": best, "best_at_half": half}

    runs = [run("a", 0, 1.0, 1.2), run("b", 0, 1.1, None), run("a", 1, 2.2, 2.2),
            run("b", 1, 2.0, 2.0)]  # fmt: skip
    gaps = _regret(runs)["s"]
    assert gaps["a (end)"] == pytest.approx((0.0 + 0.1) / 2)
    assert gaps["b (end)"] == pytest.approx((0.1 + 0.0) / 2)
    assert gaps["b (half)"] == float("inf")  # no trial completed by half its samples


# `python -m app.bench --warm-start`


def test_the_warm_start_goals_follow_the_issue_with_their_figures():
    from app.bench.studies.warm_start import goals as warm_goals
    from app.bench.studies.warm_start import warm_start_table

    cold = _study(600.0, [_row(0, 1.2, 1200.0), _row(1, 1.0, 1500.0)])
    quick = _study(500.0, [_row(0, 1.005, 1100.0), _row(1, 0.99, 1400.0)])  # 100 s, best 0.99
    slow = _study(700.0, [_row(0, 1.005, 1400.0)])  # 400 s: past half the cold wall
    worse = _study(200.0, [_row(0, 1.009, 1050.0)])  # in time, but ends above 1.0
    g = warm_goals(cold, quick)
    assert g["within_1pct_of_the_cold_best_in_half_its_wall"] == {
        "reach_s": 100.0, "limit_s": 300.0, "met": True}  # fmt: skip
    assert g["ends_no_worse_than_the_cold_study"]["met"]
    assert not warm_goals(cold, slow)["within_1pct_of_the_cold_best_in_half_its_wall"]["met"]
    assert not warm_goals(cold, worse)["ends_no_worse_than_the_cold_study"]["met"]
    run = {"pair": "data", "seed": 0, "studies": {"first": cold, "cold": cold, "warm": quick},
           "goals": g}  # fmt: skip
    table = warm_start_table({"take": "enqueue", "cores": None, "runs": [run]})
    assert "| data | 0 | warm | 2 (complete: 2) | 500 | 0.9900 | 100 |" in table
    assert "| data | 0 | ends_no_worse_than_the_cold_study | True |" in table


def test_the_warm_start_plan_runs_each_study_once_and_a_warm_one_after_its_source(monkeypatch):
    """The data pair's cold study is the model pair's first (the default study): run once; on
    two cores a free core takes the first study whose source has finished."""
    from app.bench.studies import warm_start

    jobs = warm_start.plan(["model", "data"], ["hpo=optuna"], "enqueue", "/t")
    assert list(jobs) == [
        "default", "model.n_embd=192", "data.builtin_num_docs=2000",
        "model.n_embd=192 <- default", "default <- data.builtin_num_docs=2000",
    ]  # fmt: skip
    warm = jobs["default <- data.builtin_num_docs=2000"]
    assert warm.source == "data.builtin_num_docs=2000"
    assert f"storage: {jobs[warm.source].journal}" in warm.overrides[-2]
    seconds = {"default": 3, "model.n_embd=192": 6, "data.builtin_num_docs=2000": 3}
    log: list[tuple[str, int]] = []
    finished: set[str] = set()
    lock = threading.Lock()

    def fake_study(overrides, keep, core):  # a study "takes" its seconds on its core
        name = next(n for n, j in jobs.items() if j.journal == keep)
        with lock:
            assert jobs[name].source is None or jobs[name].source in finished
            log.append((name, core))
        time.sleep(seconds.get(name, 4) / 100)
        with lock:
            finished.add(name)
        return _study(1.0, [])

    monkeypatch.setattr(warm_start, "run_study", fake_study)
    warm_start.run_jobs(jobs, [0, 1])
    assert all(j.result is not None for j in jobs.values()) and len(log) == 5
    assert {log[0], log[1]} == {("default", 0), ("model.n_embd=192", 1)} or {
        log[0], log[1]} == {("default", 1), ("model.n_embd=192", 0)}  # fmt: skip
    assert log[2][0] == "data.builtin_num_docs=2000"  # the cold ones first, in the pairs' order


@pytest.mark.e2e
def test_a_bench_study_runs_on_the_core_it_is_given_and_counts_its_own_cpu(tmp_path):
    from app.bench.studies.hpo import run_child

    busy = "import os,sys,time\nt=time.process_time()\nwhile time.process_time()-t<0.3: pass\n"
    show = "sys.stderr.write(str(sorted(os.sched_getaffinity(0))))"
    code, cpu, err = run_child([sys.executable, "-c", busy + show], tmp_path / "err", core=0)
    assert (code, err) == (0, "[0]") and cpu >= 0.3


def test_a_budget_only_run_leaves_the_grid_and_trainer_goals_not_run():
    """`--budget-only` runs no grid and no Trainer: (a) and (d) say so (met None), and the
    table prints them as not run, never as met or missed."""
    from app.bench.studies.default_study import default_study_table
    from app.bench.studies.default_study import goals as default_goals

    none = {**_study(900.0, [_row(0, 1.00, 1800.0)]), "cpu_s": 800.0}
    quick = {**_study(700.0, [_row(0, 1.005, 1200.0)]), "cpu_s": 690.0}
    g = default_goals({"none": none, "default": quick}, None, None)
    assert g["a_pick_within_1pct_of_the_grid"] == {"met": None}
    assert g["d_under_half_of_the_trainer"] == {"met": None}
    assert g["b_within_1pct_in_a_quarter_of_the_unpruned_wall"]["met"]  # 200 s <= 225 s
    run = {"seed": 0, "studies": {"none": none, "default": quick}, "pick": {},
           "pick_retrained": None, "goals": g}  # fmt: skip
    table = default_study_table({"samples": 9600, "grid": None, "grid_best": None,
                                 "seeds": [run]})  # fmt: skip
    assert "grid: not run (every trial on 9,600 samples)" in table
    assert "goal a_pick_within_1pct_of_the_grid: not run" in table
    assert "goal b_within_1pct_in_a_quarter_of_the_unpruned_wall: met" in table


def test_a_budget_only_run_warms_the_micro_batch_cache_before_the_unpruned_study(monkeypatch):
    """As the grid does in a full run: every batch of the space probed into the shared cache
    before the unpruned study, which would otherwise pay for the probes the default study then
    finds cached. No Trainer study and no retraining run."""
    from app.bench.studies import default_study

    calls: list[list[str]] = []

    def fake_study(overrides: list[str]) -> dict:
        calls.append(overrides)
        return {**_study(100.0, [_row(0, 1.0, 1050.0)]), "cpu_s": 90.0}

    def no_trainer(*args: object) -> dict:
        raise AssertionError("a budget-only run ran the Trainer's study")

    monkeypatch.setattr(default_study, "run_study", fake_study)
    monkeypatch.setattr(default_study, "run_trainer_study", no_trainer)
    monkeypatch.setattr(default_study, "data_budget", lambda overrides: 9600)
    report = default_study.run_default_study_bench([], [3], budget_only=True)
    warm, none, default = calls  # the warm-up, then the seed's two studies, nothing else
    assert "training.max_steps=1" in warm and "hpo.sampler=grid" in warm
    assert "choice(16, 32, 64)" in warm[-1]
    assert "hpo.pruner=none" in none and "hpo.seed=3" in none and "hpo.seed=3" in default
    caches = {next(o for o in c if o.startswith("training.auto_batch.cache_dir=")) for c in calls}
    assert len(caches) == 1  # one cache, shared
    assert report["grid"] is None and report["seeds"][0]["pick_retrained"] is None
