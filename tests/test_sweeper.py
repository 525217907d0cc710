"""Unit tests of the Optuna sweeper: search space, settings, samplers, budget, stale trials,
secrets, reporter. In process, no Hydra app: milliseconds each."""

from __future__ import annotations

import importlib.util
import re
import time

import optuna
import pytest
from omegaconf import OmegaConf
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from app.hpo import TrialAttrs
from hydra_plugins.hydratrain_optuna_sweeper import reporter
from hydra_plugins.hydratrain_optuna_sweeper._errors import SweepConfigError
from hydra_plugins.hydratrain_optuna_sweeper._pruners._kind import (
    ReportAxis,
    build_pruner,
    pruner_defaults,
    schedule_of,
    study_pruner_args,
)
from hydra_plugins.hydratrain_optuna_sweeper._pruners._lineage import UNCOUNTED
from hydra_plugins.hydratrain_optuna_sweeper._study._samplers import (
    ALIASES,
    build_sampler,
    sampler_names,
)
from hydra_plugins.hydratrain_optuna_sweeper._study._settings import (
    Liveness,
    read_hpo,
    read_settings,
)
from hydra_plugins.hydratrain_optuna_sweeper._study._shared import (
    HEARTBEAT,
    StudyTrialBudget,
    fail_stale_trials,
    heartbeat,
)
from hydra_plugins.hydratrain_optuna_sweeper._study._space import (
    Entry,
    format_value,
    legacy_entries,
    parse_space,
)
from hydra_plugins.hydratrain_optuna_sweeper._study._stock import (
    SEARCH_SPACE_DEPRECATED,
    StockOptions,
)
from hydra_plugins.hydratrain_optuna_sweeper._study._storage import (
    Masker,
    StorageSpec,
    open_storage,
    with_driver,
)

pytestmark = pytest.mark.integration

optuna.logging.set_verbosity(optuna.logging.WARNING)
HPO_NODE = StockOptions(stock_node=False)  # hpo=optuna's node: every stock key unset


def _hpo(**over):
    base = {"study_name": "s", "n_trials": 4, "direction": "minimize", "metric": "final_val_loss"}
    return OmegaConf.create({**base, **over})


def _settings(stock: StockOptions = HPO_NODE, **over):
    return read_settings(stock, _hpo(**over), "/tmp/sweep")


def _space(*texts: str):
    return parse_space([Entry("p", t) for t in texts])


def test_stock_grammar_maps_to_optuna_distributions():
    space = _space(
        "a=choice(16, 32, 64)",
        "b=tag(log, interval(1e-4, 1e-2))",
        "c=interval(0.0, 0.2)",
        "d=range(0, 20, step=5)",
        "e=tag(log, int(interval(8, 512)))",
        "f=range(0.1, 0.5, step=0.1)",
        "g=fixed_value",
    )
    d = space.distributions
    assert d["a"] == CategoricalDistribution([16, 32, 64])
    assert d["b"] == FloatDistribution(1e-4, 1e-2, log=True)
    assert d["c"] == FloatDistribution(0.0, 0.2)
    assert d["d"] == IntDistribution(0, 20, step=5)  # inclusive, as the stock sweeper
    assert d["e"] == IntDistribution(8, 512, log=True)
    assert isinstance(d["f"], FloatDistribution) and d["f"].step == pytest.approx(0.1)
    assert space.fixed == {"g": "fixed_value"}


def test_choice_of_lists_and_dicts_samples_their_text_and_passes_the_value():
    space = _space("k=choice([1,2],[3,4])", "m=choice({a:1},{b:2})", "s=choice('a b', c)")
    assert space.distributions["k"] == CategoricalDistribution(["[1,2]", "[3,4]"])  # as stock
    assert space.override("k", "[3,4]") == "k=[3,4]"  # the job gets the list back
    assert space.override("m", "{b:2}") == "m={b:2}"
    assert space.override("s", "a b") == "s=a\\ b"  # a string Hydra parses back whole


def test_later_entries_win_so_the_command_line_overrides_config():
    space = _space("a=choice(1, 2)", "b=choice(3, 4)", "a=choice(5, 6)", "b=7")
    assert list(space.distributions) == ["a"] and space.fixed == {"b": "7"}
    assert space.distributions["a"] == CategoricalDistribution([5, 6])


def test_delete_overrides_pass_to_jobs_and_leave_the_space():
    space = _space("z=choice(1, 2)", "~z", "~y=10")
    assert space.distributions == {} and space.deletions == ["~z", "~y=10"]


def test_malformed_expression_names_the_setting():
    entry = Entry("hydra.sweeper.params.training.lr", "training.lr=interval(1e-4")
    with pytest.raises(SweepConfigError, match=r"hydra\.sweeper\.params\.training\.lr"):
        parse_space([entry])


def test_reversed_interval_names_the_setting_and_the_values():
    entry = Entry("hydra.sweeper.params.training.lr", "training.lr=interval(1e-2, 1e-4)")
    with pytest.raises(SweepConfigError, match=r"params\.training\.lr=interval\(1e-2, 1e-4\): "):
        parse_space([entry])


def test_own_params_replace_the_default_space_and_null_drops_a_key():
    hpo = {"params": {"training.lr": "interval(0.1, 0.2)", "training.wd": "choice(0, 1)"}}
    own = read_settings(
        StockOptions(False, {"params": {"training.bs": "choice(8, 16)"}}), _hpo(**hpo), ""
    )
    assert [p for _, p in own.space_sources] == ["hydra.sweeper.params"]
    drop = read_settings(StockOptions(False, {"params": {"training.wd": None}}), _hpo(**hpo), "")
    entries = [e for m, p in drop.space_sources for e in _entries(m, p)]
    assert list(parse_space(entries).distributions) == ["training.lr"]


# -- hydra.sweeper.search_space: the stock sweeper's legacy node, as its last release reads it --

LEGACY = {"x": {"type": "float", "low": -5.5, "high": 5.5, "step": 0.5}}


@pytest.mark.parametrize(
    ("node", "expected"),
    [  # the stock plugin's own table (its test_create_optuna_distribution_from_config) ...
        ({"type": "categorical", "choices": [1, 2, 3]}, CategoricalDistribution([1, 2, 3])),
        ({"type": "int", "low": 0, "high": 10}, IntDistribution(0, 10)),
        ({"type": "int", "low": 0, "high": 10, "step": 2}, IntDistribution(0, 10, step=2)),
        ({"type": "int", "low": 1, "high": 100, "log": True}, IntDistribution(1, 100, log=True)),
        ({"type": "float", "low": 0, "high": 1}, FloatDistribution(0, 1)),
        ({"type": "float", "low": 0, "high": 10, "step": 2}, FloatDistribution(0, 10, step=2)),
        (
            {"type": "float", "low": 1, "high": 100, "log": True},
            FloatDistribution(1, 100, log=True),
        ),
        # ... and what its code does beyond it: log ignores step, int casts
        (
            {"type": "int", "low": 8, "high": 64, "step": 8, "log": True},
            IntDistribution(8, 64, log=True),
        ),
        ({"type": "int", "low": 0.0, "high": 9.0, "step": 3.0}, IntDistribution(0, 9, step=3)),
    ],
)
def test_legacy_search_space_builds_the_stock_distributions(node, expected):
    entry = legacy_entries({"k": node}, "hydra.sweeper.search_space")
    assert parse_space(entry).distributions == {"k": expected}


@pytest.mark.parametrize(
    ("node", "needle"),
    [
        ({"type": "normal", "low": 0, "high": 1}, ".k.type='normal' is not allowed"),
        ({"low": 0, "high": 1}, ".k.type=None is not allowed; choose one of: int, float"),
        ({"type": "float", "low": 0}, ".k: a float needs low and high"),
        ({"type": "categorical"}, ".k.choices must list the values of a categorical"),
        ({"type": "int", "low": 0, "high": 1, "q": 1}, ".k.q: no such field; known: type,"),
        ({"type": "float", "low": 1, "high": 0}, ".k={'type': 'float', 'low': 1, 'high': 0}: "),
        ({"type": "float", "low": 0, "high": 1, "log": True}, "'log': True}: "),
        ("interval(0, 1)", ".k='interval(0, 1)' must be a mapping with a type"),
    ],
)
def test_a_bad_legacy_entry_is_one_line_naming_it(node, needle):
    with pytest.raises(SweepConfigError) as err:
        legacy_entries({"k": node}, "hydra.sweeper.search_space")
    assert str(err.value).startswith("hydra.sweeper.search_space.k") and needle in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("stock_node", [True, False])
def test_legacy_search_space_alone_is_the_space_with_the_stock_deprecation_warning(stock_node):
    from hydra_plugins.hydratrain_optuna_sweeper._sweep._plan import _space as space_of

    hpo = _hpo(params={"training.lr": "interval(0.1, 0.2)"})  # replaced, as by own params
    with pytest.warns(UserWarning, match=re.escape(SEARCH_SPACE_DEPRECATED)):
        s = read_settings(StockOptions(stock_node, {"search_space": LEGACY}), hpo, "")
    assert s.search_space == LEGACY and s.space_sources == []
    # as stock: the command line adds to it, replaces a key, or fixes one
    space = space_of(s, ["y=choice(1, 2)", "x=3"])
    assert space.distributions == {"y": CategoricalDistribution([1, 2])}
    assert space.fixed == {"x": "3"}
    assert space_of(s, []).distributions == {"x": FloatDistribution(-5.5, 5.5, step=0.5)}


def test_legacy_search_space_beside_params_is_ignored_with_the_stock_warning():
    stock = StockOptions(True, {"params": {"y": "choice(1, 2)"}, "search_space": LEGACY})
    ignored = (  # hydra-optuna-sweeper 1.3.0's words
        "Both hydra.sweeper.params and hydra.sweeper.search_space are configured.\n"
        "Hydra will use hydra.sweeper.params for defining search space.\n"
        "https://hydra.cc/docs/upgrades/1.1_to_1.2/changes_to_sweeper_config/"
    )
    with pytest.warns(UserWarning) as warned:
        s = read_settings(stock, None, "")
    assert [str(w.message) for w in warned] == [ignored]
    assert s.search_space is None
    assert s.space_sources == [({"y": "choice(1, 2)"}, "hydra.sweeper.params")]


def test_deprecation_warnings_as_errors_make_the_legacy_node_one_line(monkeypatch):
    monkeypatch.setenv("HYDRA_DEPRECATION_WARNINGS_AS_ERRORS", "1")
    with pytest.raises(SweepConfigError) as err:
        read_settings(StockOptions(True, {"search_space": LEGACY}), None, "")
    assert str(err.value) == (
        "hydra.sweeper.search_space: `hydra.sweeper.search_space` is deprecated and will be "
        "removed in the next major release."
    )


def _entries(mapping, prefix):
    from hydra_plugins.hydratrain_optuna_sweeper._study._space import params_entries

    return params_entries(mapping, prefix)


@pytest.mark.parametrize(
    ("over", "key"),
    [
        ({"sampler": "annealing"}, "hpo.sampler='annealing'"),
        ({"pruner": "patient"}, "hpo.pruner='patient'"),
        ({"direction": "up"}, "hpo.direction='up'"),
        ({"n_trials": 0}, "hpo.n_trials=0"),
        ({"direction": ["minimize", "maximize"]}, "hpo.direction"),  # one metric, two directions
        ({"stale_after": 5, "heartbeat_interval": 10}, "hpo.stale_after"),
        ({"sampler_args": {"n_startup": 3}}, "hpo.sampler_args.n_startup"),
        ({"n_trail": 5}, "hpo.n_trail: no such setting"),
    ],
)
def test_bad_settings_raise_one_line_naming_the_key(over, key):
    with pytest.raises(SweepConfigError) as err:
        _settings(**over)
    assert key in str(err.value) and "\n" not in str(err.value)


def test_a_typed_hpo_node_rejects_a_misspelled_key_naming_it():
    with pytest.raises(SweepConfigError, match=r"hpo\.n_trail: no such setting in hpo"):
        read_hpo({"n_trail": 5})


def test_bad_pruner_args_name_the_key():
    with pytest.raises(SweepConfigError, match=r"hpo\.pruner_args"):
        build_pruner("median", {"n_startup": 1}, 1)


def _rung_steps(pruner: optuna.pruners.BasePruner, last_step: int) -> list[int]:
    """The steps at which a lone trial, reporting at every step, completed each rung: what the
    built pruner does. A lone trial is the best of every rung, so it climbs them all; Optuna
    records each rung as the system attribute completed_rung_<k> = the value then (the step)."""
    study = optuna.create_study(pruner=pruner)
    trial = study.ask()
    for step in range(1, last_step + 1):
        trial.report(float(step), step)
        assert not trial.should_prune()
    attrs = study.trials[0].system_attrs
    return [int(attrs[k]) for k in sorted(attrs, key=lambda k: int(k.rsplit("_", 1)[1]))]


def test_successive_halving_judges_at_a_ninth_and_a_third_of_the_run():
    pruner = build_pruner("successive_halving", {}, 1, ReportAxis(every=10, last=900))
    # reduction factor 3: rungs at 100 (900 / 9), 300 (900 / 3), then 900, the end
    assert _rung_steps(pruner, 900) == [100, 300, 900]


def test_a_reduction_factor_in_pruner_args_places_the_first_rung_for_that_factor():
    schedule = ReportAxis(every=10, last=800)
    pruner = build_pruner("successive_halving", {"reduction_factor": 2}, 1, schedule)
    assert _rung_steps(pruner, 800) == [200, 400, 800]  # 800 / 2**2, 800 / 2
    pruner = build_pruner("successive_halving", {"reduction_factor": 2, "min_resource": 30}, 1)
    assert _rung_steps(pruner, 130) == [30, 60, 120]  # a min_resource of its own is kept


def test_hyperband_halves_by_three_too():
    # Brackets from 10 to 20 steps: one bracket, whose rungs are 3 times apart.
    pruner = build_pruner("hyperband", {}, 1, ReportAxis(every=10, last=20))
    assert _rung_steps(pruner, 100) == [10, 30, 90]


@pytest.mark.parametrize("factor", [1, 2.5, "3", True])
def test_a_bad_reduction_factor_is_one_line(factor):
    with pytest.raises(SweepConfigError, match=r"hpo\.pruner_args\.reduction_factor=") as err:
        build_pruner("successive_halving", {"reduction_factor": factor}, 1, ReportAxis(10, 90))
    assert "\n" not in str(err.value)


def test_a_pruner_argument_optuna_refuses_is_one_line():
    with pytest.raises(SweepConfigError, match=r"hpo\.pruner_args=\{'min_resource': 0\}"):
        build_pruner("successive_halving", {"min_resource": 0}, 1)


def test_stock_keys_take_precedence_with_their_stock_meaning():
    stock = StockOptions.of(
        {"n_trials": 9, "sampler": {"_target_": "optuna.samplers.RandomSampler"}}, stock_node=False
    )
    s = _settings(stock, n_trials=4)
    assert s.budget.n_trials == 9 and s.budget.per_run  # 9 more trials per run
    assert s.sampler_key == "hydra.sweeper.sampler"
    assert _settings(n_trials=4).budget == type(s.budget)(4, False, "hpo.n_trials")


@pytest.mark.parametrize(
    "direction, hpo",
    [("maximize", None), (["maximize", "minimize"], None), ("maximize", {"direction": "minimize"})],
    ids=["stock-node", "stock-node-two", "over-hpo-direction"],
)
def test_the_stock_direction_is_the_studys_whatever_hpo_direction_says(direction, hpo):
    """Every stock example minimizes, so a stock `maximize` ignored would go unseen there."""
    stock = StockOptions.of({"direction": direction}, stock_node=hpo is None)
    s = read_settings(stock, None if hpo is None else _hpo(**hpo), "/tmp/sweep")
    assert s.directions == ([direction] if isinstance(direction, str) else direction)
    assert s.direction_key == "hydra.sweeper.direction"


def test_the_stock_node_means_in_memory_and_a_fresh_study():
    s = read_settings(
        StockOptions(True, {"n_trials": 20, "direction": "minimize"}), None, "/tmp/sweep"
    )
    assert s.storage.kind == "memory" and s.study_name is None and s.metrics is None


def _build(name: str, **over):
    node = _settings(sampler=name, **over).sampler
    grid = {"x": [1, 2, 3]}
    return build_sampler(node, "hpo.sampler", lambda: grid, 1, oom=True)


@pytest.mark.parametrize("name", [*sampler_names(), *ALIASES])
def test_every_sampler_builds(name):
    if name == "gp" and importlib.util.find_spec("torch") is None:
        pytest.skip("GPSampler needs torch before Optuna 5 (CI's Optuna 4 check has none)")
    assert isinstance(_build(name), optuna.samplers.BaseSampler)


def test_every_argument_of_the_installed_sampler_is_reachable_through_sampler_args():
    """Read from the installed Optuna's signature, not a copied table: constant_liar and group
    (TPE) and deterministic_objective (GP) are not fields of the stock configs."""
    tpe = _build("tpe", sampler_args={"constant_liar": True, "group": True, "multivariate": True})
    assert (tpe._constant_liar, tpe._group, tpe._multivariate) == (True, True, True)
    if importlib.util.find_spec("torch") is not None:
        gp = _build("gp", sampler_args={"n_startup_trials": 3})
        assert gp._n_startup_trials == 3
    with pytest.raises(SweepConfigError, match=r"hpo\.sampler_args\.n_startup: no such argument"):
        _build("tpe", sampler_args={"n_startup": 3})


def test_hpo_sampler_tpe_is_the_measured_tpe_whatever_the_optuna_version():
    """hpo.sampler=tpe (the default study's): univariate, constant liar, 5 start-up trials for
    the default budget, as chosen by `python -m app.bench --sampler-choice` and
    `--default-study`, on Optuna 4.x (whose TPE defaults are univariate without constant liar)
    and 5 (multivariate with it) alike; sampler_args wins."""
    tpe = _build("tpe", n_trials=None)  # the default budget: 20 full trials' worth
    assert (tpe._multivariate, tpe._constant_liar, tpe._n_startup_trials) == (False, True, 5)
    mine = _build("tpe", sampler_args={"multivariate": True, "n_startup_trials": 7})
    assert (mine._multivariate, mine._constant_liar, mine._n_startup_trials) == (True, True, 7)


@pytest.mark.parametrize(
    "over, startup",
    [
        ({"n_trials": None}, 5),  # 20 full trials' worth
        ({"n_trials": None, "budget_trials": 100}, 10),  # never more than Optuna's own
        ({"n_trials": None, "budget_trials": 2.5}, 1),
        ({"n_trials": 8}, 2),
        ({"n_trials": 60}, 10),
    ],
)
def test_tpes_random_start_up_is_a_quarter_of_the_budget_at_most_optunas_ten(over, startup):
    assert _build("tpe", **over)._n_startup_trials == startup


@pytest.mark.parametrize(
    "over, args",
    [
        ({"n_trials": None}, {"bootstrap_count": 2}),  # the default: 20 full trials' worth
        ({"n_trials": None, "budget_trials": 100}, {"bootstrap_count": 2}),
        ({"n_trials": None, "budget_trials": 10}, {"bootstrap_count": 2}),
        ({"n_trials": None, "budget_trials": 9.5}, {}),  # too short to afford it
        ({"n_trials": 20}, {}),  # a count: the trials it stops would not buy more
        ({"n_trials": None, "pruner_args": {"bootstrap_count": 0}}, {"bootstrap_count": 0}),
        ({"n_trials": None, "pruner": "asha"}, {}),  # only successive halving was measured
    ],
)
def test_successive_halving_waits_for_two_trials_at_a_rung_in_a_study_of_ten_or_more(over, args):
    """The default pruner's bootstrap follows the study's budget (docs/benchmarks.md, "The
    default study against a grid") in trials' worth; hpo.pruner_args wins. Without a schedule
    the same: the rungs are placed as for a declared one once the study has learned it."""
    s = _settings(**over)
    assert study_pruner_args(s.pruner, s.pruner_args, s.budget.worth, ReportAxis(10, 90)) == args
    assert study_pruner_args(s.pruner, s.pruner_args, s.budget.worth, None) == args


def test_a_job_in_another_process_builds_the_pruner_the_sweep_resolved(tmp_path):
    """A trial's job reads the pruner's arguments the sweep recorded in the study (budget
    defaults included), not its own hpo node's: with bootstrap_count=2 the first trial to reach
    a rung is stopped there; with the node's arguments alone (none) it would go on."""
    from hydra_plugins.hydratrain_optuna_sweeper._pruners._kind import record_pruner_args
    from hydra_plugins.hydratrain_optuna_sweeper._study._storage import journal

    storage = str(tmp_path / "study.journal")
    study = optuna.create_study(study_name="s", storage=journal(storage))
    record_pruner_args(study, {"bootstrap_count": 2})
    trial = study.ask()
    hpo = {"study_name": "s", "storage": storage, "trial_number": trial.number}
    cfg = OmegaConf.create({"hpo": hpo, "training": {"eval_every": 10, "max_steps": 90}})
    job = reporter.reporter_for_job(cfg)
    assert job.report(10, {"val_loss": 1.0}) is True  # rung 0 at step 10 (90 / 9)


def test_the_stock_sampler_node_keeps_the_stock_fields():
    """hydra/sweeper/sampler=tpe is the stock config: univariate TPE, as that sweeper built it."""
    from hydra_plugins.hydratrain_optuna_sweeper.config import TPESamplerConfig

    node = OmegaConf.structured(TPESamplerConfig)
    stock = StockOptions.of({"sampler": node}, stock_node=True)
    s = read_settings(stock, None, "/tmp/sweep")
    sampler = build_sampler(s.sampler, s.sampler_key, dict, 1, oom=False)
    assert sampler._multivariate is False and sampler._n_startup_trials == 10


def test_the_budget_is_in_trials_worth_unless_a_count_is_set():
    s = _settings(n_trials=None)
    assert (s.budget.worth, s.budget.n_trials, s.budget.key) == (20.0, None, "hpo.budget_trials")
    assert _settings(n_trials=None, budget_trials=7.5).budget.worth == 7.5
    counted = _settings(n_trials=5).budget  # a count, as written: budget_trials does not apply
    assert (counted.n_trials, counted.worth, counted.key) == (5, None, "hpo.n_trials")
    stock = StockOptions.of({"n_trials": 3}, stock_node=False).values
    per_run = _settings(StockOptions(False, stock)).budget
    assert (per_run.n_trials, per_run.per_run, per_run.worth) == (3, True, None)
    for bad in (0, -1.0, float("inf")):
        with pytest.raises(SweepConfigError, match=r"hpo\.budget_trials="):
            _settings(n_trials=None, budget_trials=bad)


def test_motpe_is_one_line_saying_it_was_removed():
    with pytest.raises(SweepConfigError, match="motpe: The 'motpe' sampler was removed"):
        _build("motpe")


def test_a_field_this_optuna_lacks_is_one_line():
    node = OmegaConf.create({"_target_": "optuna.samplers.TPESampler", "gammma": 0.5})
    with pytest.raises(SweepConfigError, match=r"hydra\.sweeper\.sampler\.gammma=0\.5 is not"):
        build_sampler(node, "hydra.sweeper.sampler", dict, 1, oom=False)


def test_cmaes_refuses_several_objectives():
    node = _settings(sampler="cmaes").sampler
    with pytest.raises(SweepConfigError, match="CmaEsSampler optimizes one objective"):
        build_sampler(node, "hpo.sampler", dict, 2, oom=False)


def test_unreachable_storage_names_the_setting(tmp_path):
    spec = StorageSpec("url", f"sqlite:///{tmp_path}/no/such/dir/x.db", "hpo.storage")
    with pytest.raises(SweepConfigError, match=r"hpo\.storage"):
        open_storage(spec, Masker())


def test_passwords_are_masked_as_written_and_decoded():
    url = "postgresql://user:p%40ss@db.example/optuna"
    mask = Masker.of([url])
    assert mask(url) == "postgresql://user:***@db.example/optuna"
    assert "p@ss" not in mask("password authentication failed: p@ss")
    assert Masker()("mysql://a:b@h/d") == "mysql://a:***@h/d"  # any URL, known or not


def test_postgresql_urls_get_the_installed_driver(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda m, *a: None if m == "psycopg" else real(m, *a)
    )
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda m, *a: object() if m == "psycopg2" else None
    )
    assert with_driver("postgresql://u:p@h/d", "hpo.storage") == "postgresql+psycopg2://u:p@h/d"
    assert with_driver("sqlite:///x.db", "hpo.storage") == "sqlite:///x.db"
    monkeypatch.setattr(importlib.util, "find_spec", lambda m, *a: None)
    with pytest.raises(SweepConfigError, match=r"pip install 'psycopg\[binary\]'"):
        with_driver("postgresql://u:p@h/d", "hpo.storage")


def test_override_values_round_trip():
    assert format_value(0.001) == "0.001"
    assert format_value(True) == "true"
    assert format_value("cosine") == "cosine"
    assert format_value("1e-3") == "'1e-3'"  # a string that looks like a number stays a string
    assert format_value("/a b/c's") == "'/a b/c\\'s'"


def _study(tmp_path, name="s"):
    path = str(tmp_path / "j.journal")
    spec = StorageSpec("journal", path, "hpo.storage")
    study = optuna.create_study(study_name=name, storage=open_storage(spec, Masker()))
    return study, spec


LIVE = Liveness(
    heartbeat_interval=15, stale_after=120, retry_stale=0, wait_for_running=True, poll_interval=2
)


def test_budget_never_over_asks_and_counts_running_trials(tmp_path):
    study, spec = _study(tmp_path)
    budget = StudyTrialBudget(study, 3, spec.lock_path, LIVE)
    trials = budget.next_trials(3)  # all three still RUNNING
    assert len(trials) == 3
    assert budget.next_trials(1) == []  # running trials hold their slots
    assert len(study.get_trials()) == 3


def test_surplus_trial_is_discarded_uncounted(tmp_path):
    """The ask-then-recheck path used without a lock (databases): a 3rd trial is not counted."""
    study, _spec = _study(tmp_path)
    for _ in range(2):
        study.tell(study.ask(), 1.0)
    budget = StudyTrialBudget(study, 2, None, LIVE)
    extra = study.ask()  # as if another worker asked concurrently
    assert budget._is_surplus(extra.number)
    budget._discard(extra)
    frozen = study.get_trials()[-1]
    assert frozen.state == TrialState.FAIL and frozen.system_attrs[UNCOUNTED]
    assert budget.next_trials(1) == []


def test_stale_trial_is_failed_and_requeued(tmp_path):
    study, spec = _study(tmp_path)
    live = Liveness(0.1, 1.0, 1, True, 0.1)  # 1 s: a busy machine's stall does not age it
    budget = StudyTrialBudget(study, 2, spec.lock_path, live)
    (stale,) = budget.next_trials(1)
    stale.suggest_float("x", 0, 1)
    assert fail_stale_trials(study, live, exclude=set()) == []  # fresh heartbeat
    time.sleep(1.2)
    assert fail_stale_trials(study, live, exclude=set()) == [stale.number]
    old, retry = study.get_trials()
    assert old.state == TrialState.FAIL and old.user_attrs["reason"] == "stale"
    assert old.system_attrs[UNCOUNTED]
    assert retry.state == TrialState.WAITING and retry.params == old.params
    assert UNCOUNTED not in retry.system_attrs
    assert optuna.storages.RetryFailedTrialCallback.retried_trial_number(retry) == old.number
    assert budget.next_trials(1)[0].number == retry.number  # the retry takes the freed slot
    assert len(budget.next_trials(1)) == 1 and budget.next_trials(1) == []


def test_the_heartbeat_stamps_running_trials_while_their_jobs_run_and_stops_after(tmp_path):
    """What keeps a long trial from being failed as stale by another worker: a stamp every
    interval on a thread of its own, and no stamp once the jobs have returned."""
    study, _spec = _study(tmp_path)
    trial = study.ask()

    def beat() -> float | None:
        return study.get_trials()[0].system_attrs.get(HEARTBEAT)

    with heartbeat(study, [trial], 0.02):
        deadline = time.monotonic() + 10
        while beat() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        first = beat()
        assert first is not None
        while beat() == first and time.monotonic() < deadline:
            time.sleep(0.01)
        assert beat() != first  # stamped again, not once
    last = beat()
    time.sleep(0.1)
    assert beat() == last  # the thread ended with the body


def test_a_stale_resumed_trial_is_retried_from_the_checkpoint_it_resumed_from(tmp_path):
    """A promoted (or preempted) trial whose worker dies: its retry resumes where it started,
    not from step 0 (ASHA's promise: a promoted trial resumes from its checkpoint exactly)."""
    study, spec = _study(tmp_path)
    live = Liveness(0.1, 1.0, 1, True, 0.1)
    budget = StudyTrialBudget(study, 2, spec.lock_path, live)
    (stale,) = budget.next_trials(1)
    stale.suggest_float("x", 0, 1)
    stale.set_user_attr("resume_from", "/runs/paused-trial-3")
    time.sleep(1.2)
    assert fail_stale_trials(study, live, exclude=set()) == [stale.number]
    _, retry = study.get_trials()
    assert retry.state == TrialState.WAITING
    assert retry.user_attrs["resume_from"] == "/runs/paused-trial-3"


def _job_cfg(**hpo):
    reporter_path = "hydra_plugins.hydratrain_optuna_sweeper.reporter.reporter_for_job"
    return OmegaConf.create({"hpo": _hpo(reporter=reporter_path, **hpo)})


def _job(**hpo):
    """(hpo node, config) as a job hands them to build_reporter."""
    cfg = _job_cfg(**hpo)
    return cfg.hpo, cfg


def test_reporter_rebuilds_the_trial_from_storage_and_prunes(tmp_path):
    """The path a job in another process takes: nothing but cfg.hpo and the storage."""
    from app.hpo import build_reporter

    study, spec = _study(tmp_path, name="r")
    for value in (1.0, 1.1, 1.2):  # trials of 10 steps: a report at 5 is judged
        t = study.ask()
        t.report(value, 5)
        t.report(value, 10)
        study.tell(t, value)
    live = study.ask()
    cfg = _job_cfg(
        study_name="r",
        storage=spec.target,
        trial_number=live.number,
        pruner="median",
        pruner_args={"n_startup_trials": 1, "n_warmup_steps": 0},
    )
    assert reporter._LIVE_TRIALS == {}
    rep = build_reporter(cfg.hpo, cfg)
    assert rep.report(5, {"val_loss": 9.0}) is True
    rep.set_attrs(TrialAttrs(micro_batch_size=4, run_dir=str(tmp_path)))
    frozen = study.get_trials()[-1]
    assert frozen.intermediate_values == {5: 9.0}
    attrs = {k: v for k, v in frozen.user_attrs.items() if v is not None}
    assert attrs == {"micro_batch_size": 4, "run_dir": str(tmp_path)}


def test_reporter_of_a_trial_failed_elsewhere_goes_quiet(tmp_path, caplog):
    study, _spec = _study(tmp_path, name="r")
    trial = study.ask()
    study.tell(trial.number, state=TrialState.FAIL)  # another worker: stale
    rep = reporter.OptunaReporter(trial, "val_loss", can_prune=True)
    assert rep.report(1, {"val_loss": 1.0}) is False
    rep.set_attrs(TrialAttrs(run_dir="x"))
    assert rep.report(2, {"val_loss": 1.0}) is False
    assert sum("finished by another worker" in r.message for r in caplog.records) == 1


def test_reporter_is_a_noop_outside_a_sweep():
    from app.hpo import NullReporter, build_reporter

    cfg = OmegaConf.create({"hpo": _hpo()})
    assert isinstance(build_reporter(cfg.hpo, cfg), NullReporter)
    assert isinstance(build_reporter(None, cfg), NullReporter)


def test_a_misspelled_hpo_key_in_an_experiment_is_an_error_naming_it(tmp_path):
    """The hpo group is typed (app/config/hpo.py): composition refuses the key, in one line."""
    from app.config.compose import compose, one_line

    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "typo.yaml").write_text("# @package _global_\nhpo: {n_trail: 5}\n")
    with pytest.raises(Exception) as err:
        compose("train", ["hpo=optuna", "experiment=typo", f"hydra.searchpath=[file://{tmp_path}]"])
    assert one_line(err.value).startswith("hpo.n_trail: no such setting in hpo; known keys:")


def test_conf_hpo_optuna_sets_no_setting_to_its_default():
    """One default per setting: the YAML sets only what differs from app/config/hpo.py."""
    from pathlib import Path

    from app.config.hpo import HpoConfig

    root = Path(__file__).resolve().parents[1]
    yaml = OmegaConf.to_container(OmegaConf.load(root / "conf" / "hpo" / "optuna.yaml").hpo)
    defaults = HpoConfig()
    for key, value in yaml.items():
        assert value != getattr(defaults, key), f"hpo.{key} restates its default"


def test_pruner_defaults_follow_the_studys_evaluation_schedule():
    every_10 = ReportAxis(every=10, last=120)
    # The first rung: the first evaluation at or after 120 / 3**2 steps.
    sh = {"reduction_factor": 3}
    assert pruner_defaults("successive_halving", every_10) == {**sh, "min_resource": 20}
    assert pruner_defaults("successive_halving", ReportAxis(50, 300))["min_resource"] == 50
    assert pruner_defaults("successive_halving", ReportAxis(25, 1000))["min_resource"] == 125
    assert pruner_defaults("hyperband", every_10) == {
        "reduction_factor": 3,
        "min_resource": 10,
        "max_resource": 120,
    }
    # Step 0 (the untrained model, alike for every trial of a seed) is never judged.
    assert pruner_defaults("median", every_10)["n_warmup_steps"] == 1
    assert schedule_of(OmegaConf.create({"training": {"eval_every": 25, "max_steps": 150}})) == (
        ReportAxis(25, 150)
    )


def test_a_jobs_pruner_is_built_with_its_own_evaluation_schedule(tmp_path, monkeypatch):
    """The reporter in a job's process rebuilds the pruner: its rungs follow training.*."""
    from app.hpo import build_reporter

    built: list[dict] = []

    class Recording(optuna.pruners.HyperbandPruner):
        def __init__(self, **kwargs):
            built.append(kwargs)
            super().__init__(**kwargs)

    monkeypatch.setattr(optuna.pruners, "HyperbandPruner", Recording)
    study, spec = _study(tmp_path, name="h")
    live = study.ask()
    cfg = _job_cfg(
        study_name="h", storage=spec.target, trial_number=live.number, pruner="hyperband"
    )
    cfg.training = {"eval_every": 10, "max_steps": 120}
    build_reporter(cfg.hpo, cfg)
    assert built == [{"reduction_factor": 3, "min_resource": 10, "max_resource": 120}]


def test_an_accuracy_study_prunes_the_low_accuracy_trial_not_the_high_one(tmp_path):
    from app.hpo import build_reporter

    path = str(tmp_path / "j.journal")
    spec = StorageSpec("journal", path, "hpo.storage")
    study = optuna.create_study(
        study_name="acc", storage=open_storage(spec, Masker()), direction="maximize"
    )
    for value in (0.80, 0.85, 0.90):  # trials of 10 steps: a report at 5 is judged
        t = study.ask()
        t.report(value, 5)
        t.report(value, 10)
        study.tell(t, value)
    over = {
        "study_name": "acc",
        "storage": spec.target,
        "direction": "maximize",
        "metric": "final_val_accuracy",
        "report_metric": "val_accuracy",
        "pruner": "median",
        "pruner_args": {"n_startup_trials": 1, "n_warmup_steps": 0},
    }
    low, high = study.ask(), study.ask()
    assert build_reporter(*_job(trial_number=low.number, **over)).report(
        5, {"val_loss": 0.1, "val_accuracy": 0.30}
    )
    assert not build_reporter(*_job(trial_number=high.number, **over)).report(
        5, {"val_loss": 9.0, "val_accuracy": 0.95}
    )


def test_both_sweeper_nodes_are_made_from_the_one_table_of_stock_keys():
    """hydra/sweeper=optuna has the stock plugin's keys and defaults (its 1.3.0 config.py);
    hydra/sweeper=hydratrain_optuna the same keys, unset; each row maps onto a real hpo.*."""
    import dataclasses

    from app.config.hpo import HpoConfig
    from hydra_plugins.hydratrain_optuna_sweeper.config import (
        STOCK_KEYS,
        HydratrainOptunaSweeperConf,
        OptunaSweeperConf,
    )

    stock = OmegaConf.structured(OptunaSweeperConf)
    ours = OmegaConf.structured(HydratrainOptunaSweeperConf)
    names = [k.name for k in STOCK_KEYS]
    assert [k for k in stock if not k.startswith("_") and k != "defaults"] == names
    assert OmegaConf.to_container(stock, throw_on_missing=False) == {
        "_target_": "hydra_plugins.hydratrain_optuna_sweeper.optuna_sweeper.OptunaSweeper",
        "defaults": [{"sampler": "tpe"}],
        "_recursive_": False,
        "sampler": "???",
        "direction": "minimize",
        "storage": None,
        "study_name": None,
        "n_trials": 20,
        "n_jobs": 2,
        "max_failure_rate": 0.0,
        "params": None,
        "custom_search_space": None,
        "search_space": None,
    }
    assert ours.defaults == ["_self_", {"sampler": None}] and not ours._recursive_
    assert all(ours[name] is None for name in names)
    hpo = {f"hpo.{f.name}" for f in dataclasses.fields(HpoConfig)}
    assert {k.setting for k in STOCK_KEYS} - {None} <= hpo


def test_the_reporter_reads_the_one_name_it_was_given(tmp_path, caplog):
    """hpo.report_metric is checked against the task's reported names when the sweep starts,
    so the reporter reads that key alone: a summary key of the same metric is not it."""
    study, _spec = _study(tmp_path, name="r")
    rep = reporter.OptunaReporter(study.ask(), "val_loss", can_prune=True)
    assert rep.report(1, {"final_val_loss": 1.0}) is False
    assert study.get_trials()[-1].intermediate_values == {}
    assert sum("is not among reported metrics" in r.message for r in caplog.records) == 1
    rep.report(2, {"val_loss": 2.0})
    assert study.get_trials()[-1].intermediate_values == {2: 2.0}
