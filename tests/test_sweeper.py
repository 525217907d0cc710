"""Unit tests of the Optuna sweeper: search space, settings, budget, stale trials, reporter."""

from __future__ import annotations

import time

import optuna
import pytest
from omegaconf import OmegaConf
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from hydra_plugins.hydratrain_optuna_sweeper import reporter
from hydra_plugins.hydratrain_optuna_sweeper._settings import (
    SweepConfigError,
    build_pruner,
    build_sampler,
    read_settings,
)
from hydra_plugins.hydratrain_optuna_sweeper._space import format_value, parse_space
from hydra_plugins.hydratrain_optuna_sweeper._study import (
    UNCOUNTED,
    Budget,
    fail_stale_trials,
    open_storage,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _hpo(**over):
    base = {"study_name": "s", "n_trials": 4, "direction": "minimize", "metric": "final_val_loss"}
    return OmegaConf.create({**base, **over})


def test_stock_grammar_maps_to_optuna_distributions():
    space, fixed = parse_space(
        [
            ("p", "a=choice(16, 32, 64)"),
            ("p", "b=tag(log, interval(1e-4, 1e-2))"),
            ("p", "c=interval(0.0, 0.2)"),
            ("p", "d=range(0, 20, step=5)"),
            ("p", "e=tag(log, int(interval(8, 512)))"),
            ("p", "f=range(0.1, 0.5, step=0.1)"),
            ("p", "g=fixed_value"),
        ]
    )
    assert space["a"] == CategoricalDistribution([16, 32, 64])
    assert space["b"] == FloatDistribution(1e-4, 1e-2, log=True)
    assert space["c"] == FloatDistribution(0.0, 0.2)
    assert space["d"] == IntDistribution(0, 20, step=5)  # inclusive, as the stock sweeper
    assert space["e"] == IntDistribution(8, 512, log=True)
    assert isinstance(space["f"], FloatDistribution) and space["f"].step == pytest.approx(0.1)
    assert fixed == {"g": "g=fixed_value"}


def test_later_entries_win_so_the_command_line_overrides_config():
    space, fixed = parse_space([("p", "a=choice(1, 2)"), ("cli", "a=3")])
    assert space == {} and fixed == {"a": "a=3"}


def test_malformed_expression_names_the_setting():
    with pytest.raises(SweepConfigError, match=r"hydra\.sweeper\.params\.training\.lr"):
        parse_space([("hydra.sweeper.params.training.lr", "training.lr=interval(1e-4")])


@pytest.mark.parametrize(
    ("over", "key"),
    [
        ({"sampler": "annealing"}, "hpo.sampler"),
        ({"pruner": "patient"}, "hpo.pruner"),
        ({"direction": "up"}, "hpo.direction"),
        ({"n_trials": 0}, "hpo.n_trials"),
        ({"direction": ["minimize", "maximize"]}, "hpo.direction"),  # one metric, two directions
        ({"stale_after": 5, "heartbeat_interval": 10}, "hpo.stale_after"),
        ({"sampler": "cmaes", "metric": ["a", "b"], "direction": ["minimize"] * 2}, "hpo.sampler"),
    ],
)
def test_bad_settings_raise_one_line_naming_the_key(over, key):
    with pytest.raises(SweepConfigError) as err:
        read_settings(_hpo(**over), {})
    assert key in str(err.value) and "\n" not in str(err.value)


def test_bad_pruner_args_name_the_key():
    s = read_settings(_hpo(pruner="median", pruner_args={"n_startup": 1}), {})
    with pytest.raises(SweepConfigError, match=r"hpo\.pruner_args"):
        build_pruner(s)


def test_stock_keys_take_precedence_over_hpo():
    s = read_settings(_hpo(n_trials=4), {"n_trials": 9, "sampler": {"seed": 123}})
    assert s.n_trials == 9 and s.sampler_args == {"seed": 123}
    assert isinstance(build_sampler(s), optuna.samplers.TPESampler)


@pytest.mark.parametrize("name", ["tpe", "random", "qmc", "nsga2", "gp"])
def test_every_sampler_builds(name):
    assert build_sampler(read_settings(_hpo(sampler=name), {})) is not None


def test_unreachable_storage_names_the_setting(tmp_path):
    url = f"sqlite:///{tmp_path}/no/such/dir/x.db"
    with pytest.raises(SweepConfigError, match=r"hpo\.storage"):
        open_storage(url)


def test_override_values_round_trip():
    assert format_value(0.001) == "0.001"
    assert format_value(True) == "true"
    assert format_value("cosine") == "cosine"
    assert format_value("1e-3") == "'1e-3'"  # a string that looks like a number stays a string
    assert format_value("/a b/c's") == "'/a b/c\\'s'"


def _study(tmp_path, name="s"):
    storage = str(tmp_path / "j.journal")
    study = optuna.create_study(study_name=name, storage=open_storage(storage))
    return study, storage


def test_budget_never_over_asks_and_counts_running_trials(tmp_path):
    study, storage = _study(tmp_path)
    s = read_settings(_hpo(n_trials=3), {})
    budget = Budget(study, s, storage)
    trials = [budget.next_trial() for _ in range(3)]  # all three still RUNNING
    assert all(t is not None for t in trials)
    assert budget.next_trial() is None  # running trials hold their slots
    assert len(study.get_trials()) == 3


def test_surplus_trial_is_discarded_uncounted(tmp_path):
    """The ask-then-recheck path used without a lock (databases): a 4th trial is not counted."""
    study, storage = _study(tmp_path)
    s = read_settings(_hpo(n_trials=2), {})
    for _ in range(2):
        study.tell(study.ask(), 1.0)
    budget = Budget(study, s, storage)
    extra = study.ask()  # as if another worker asked concurrently
    assert budget._is_surplus(extra.number)
    budget._discard(extra)
    frozen = study.get_trials()[-1]
    assert frozen.state == TrialState.FAIL and frozen.system_attrs[UNCOUNTED]
    assert budget.next_trial() is None


def test_stale_trial_is_failed_and_requeued(tmp_path):
    study, storage = _study(tmp_path)
    s = read_settings(_hpo(n_trials=2, heartbeat_interval=0.1, stale_after=0.5, retry_stale=1), {})
    budget = Budget(study, s, storage)
    stale = budget.next_trial()
    stale.suggest_float("x", 0, 1)
    assert fail_stale_trials(study, s, exclude=set()) == []  # fresh heartbeat
    time.sleep(0.7)
    assert fail_stale_trials(study, s, exclude=set()) == [stale.number]
    old, retry = study.get_trials()
    assert old.state == TrialState.FAIL and old.user_attrs["reason"] == "stale"
    assert old.system_attrs[UNCOUNTED]
    assert retry.state == TrialState.WAITING and retry.params == old.params
    assert UNCOUNTED not in retry.system_attrs
    assert budget.next_trial().number == retry.number  # the retry takes the freed slot
    assert budget.next_trial() is not None and budget.next_trial() is None


def test_reporter_rebuilds_the_trial_from_storage_and_prunes(tmp_path):
    """The path a job in another process takes: nothing but cfg.hpo and the storage."""
    study, storage = _study(tmp_path, name="r")
    for value in (1.0, 1.1, 1.2):
        t = study.ask()
        t.report(value, 5)
        study.tell(t, value)
    live = study.ask()
    hpo = _hpo(
        study_name="r",
        storage=storage,
        trial_number=live.number,
        pruner="median",
        pruner_args={"n_startup_trials": 1, "n_warmup_steps": 0},
    )
    assert reporter._LIVE_TRIALS == {}
    rep = reporter.reporter_for_job(OmegaConf.create({"hpo": hpo}))
    assert rep.report(5, {"val_loss": 9.0}) is True
    rep.set_attrs({"micro_batch_size": 4, "run_dir": tmp_path})
    frozen = study.get_trials()[-1]
    assert frozen.intermediate_values == {5: 9.0}
    assert frozen.user_attrs == {"micro_batch_size": 4, "run_dir": str(tmp_path)}


def test_reporter_is_a_noop_outside_a_sweep():
    from app.objective import NullReporter

    rep = reporter.reporter_for_job(OmegaConf.create({"hpo": _hpo()}))
    assert isinstance(rep, NullReporter)
