"""One test per row of docs/hpo.md's table of stock keys (`hydra.sweeper.*`): each means what the
stock hydra-optuna-sweeper documents, run with its own example scripts and configs (copied in
tests/stock_optuna, MIT license) and the stock plugin absent; the rows about `hpo=optuna` run
the fake trainer (tests/fake_app)."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from hydra.test_utils.test_utils import run_process
from omegaconf import OmegaConf

from hydra_plugins.hydratrain_optuna_sweeper._study._samplers import sampler_names
from hydra_plugins.hydratrain_optuna_sweeper._study._storage import journal
from tests import procs

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]
STOCK = ROOT / "tests" / "stock_optuna"
# As the stock tests run them: warnings are errors, but for Hydra's own warning about the
# examples' missing version_base (tests/test_sweeper_stock.py says why this filter).
PYTHON = [sys.executable, "-Werror", "-W", "ignore::UserWarning:__main__"]
optuna.logging.set_verbosity(optuna.logging.WARNING)


def sphere(tmp_path: Path, *args: str, check: bool = True) -> tuple[str, str]:
    """example/sphere.py --multirun ARGS, from the stock plugin's root as its tests do."""
    flags = [a for a in args if a.startswith("--")]  # argparse: before the overrides
    overrides = [a for a in args if not a.startswith("--")]
    cmd = [*PYTHON, "example/sphere.py", "--multirun", *flags, *_sweep_dir(tmp_path), *overrides]
    return _run(cmd, check)


def _sweep_dir(tmp_path: Path) -> list[str]:
    return [f"hydra.sweep.dir={tmp_path}/sweep", "hydra.job.chdir=True"]  # as the stock tests


def _run(cmd: list[str], check: bool) -> tuple[str, str]:
    cwd = Path.cwd()
    os.chdir(STOCK)
    try:
        return run_process(cmd, print_error=check, raise_exception=check)
    finally:
        os.chdir(cwd)


def _studies(url: str) -> dict[str, int]:
    return {s.study_name: s.n_trials for s in optuna.get_all_study_summaries(storage=url)}


def _results(tmp_path: Path):
    return OmegaConf.load(tmp_path / "sweep" / "optimization_results.yaml")


def test_n_trials_is_this_many_more_trials_per_run(tmp_path):
    db = f"sqlite:///{tmp_path}/s.db"
    args = ("hydra.sweeper.n_trials=5", f"hydra.sweeper.storage={db}")
    sphere(tmp_path, *args)
    sphere(tmp_path, *args)
    assert _studies(db) == {"sphere": 10}  # two identical runs: 10 trials (stock [5, 5])
    results = _results(tmp_path)
    assert {"name", "best_params", "best_value"} <= set(results)  # the stock keys, and ours
    assert results.name == "optuna" and set(results.best_params) == {"x", "y"}


def _snapshot(root: Path) -> dict[str, str]:
    return {
        str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def test_storage_null_is_in_memory_and_leaves_no_file(tmp_path):
    before = _snapshot(STOCK)
    sphere(tmp_path, "hydra.sweeper.n_trials=3")  # example/conf/config.yaml: storage: null
    assert _snapshot(STOCK) == before
    made = {p.name for p in (tmp_path / "sweep").iterdir()}
    results = {"multirun.yaml", "optimization_results.yaml"}
    report = {"report.html", "optimization_history.png", "param_importances.png"}
    assert made == {"0", "1", "2", *results, *report}  # no study file
    assert _results(tmp_path).storage == "memory"


def test_a_storage_object_opens_that_database(tmp_path):
    url = f"sqlite:///{tmp_path}/object.db"
    target = f"{{_target_:optuna.storages.RDBStorage,url:'{url}'}}"
    sphere(tmp_path, "hydra.sweeper.n_trials=3", f"hydra.sweeper.storage={target}")
    assert _studies(url) == {"sphere": 3}
    assert not list(tmp_path.glob("*{*"))  # no file named after the object's text


def test_study_name_null_is_a_fresh_study_each_run(tmp_path):
    db = f"sqlite:///{tmp_path}/s.db"
    args = (
        "hydra.sweeper.n_trials=2",
        f"hydra.sweeper.storage={db}",
        "hydra.sweeper.study_name=null",
    )
    sphere(tmp_path, *args)
    sphere(tmp_path, *args)
    assert sorted(_studies(db).values()) == [2, 2]  # two studies, automatically named


def test_n_jobs_hands_that_many_trials_to_each_launch(tmp_path):
    out, _ = sphere(tmp_path, "hydra.sweeper.n_trials=5", "hydra.sweeper.n_jobs=2")
    assert re.findall(r"Launching (\d+) jobs locally", out) == ["2", "2", "1"]
    assert _results(tmp_path).trials.COMPLETE == 5


def test_max_failure_rate_stops_the_sweep_with_one_line(tmp_path):
    _, err = sphere(tmp_path, "hydra.sweeper.max_failure_rate=0.0", "error=true", check=False)
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("[")]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: 1 of 1 trials failed (last: RuntimeError: cfg.error is")
    assert "hydra.sweeper.max_failure_rate=0.0: sweep stopped" in lines[0]


def test_direction_list_is_several_objectives_from_the_returned_tuple(tmp_path):
    cmd = [*PYTHON, "example/multi-objective.py", "--multirun", *_sweep_dir(tmp_path)]
    _run([*cmd, "hydra.sweeper.n_trials=6"], check=True)
    results = _results(tmp_path)
    assert results.directions == ["minimize", "minimize"]
    assert results.solutions and all(len(s["values"]) == 2 for s in results.solutions)


def test_custom_search_space_extends_each_trial(tmp_path):
    cmd = [
        *PYTHON,
        "-W",
        "ignore::UserWarning:custom-search-space-objective",
        "example/custom-search-space-objective.py",
        "--multirun",
        *_sweep_dir(tmp_path),
        "hydra.sweeper.n_trials=4",
    ]
    _run(cmd, check=True)
    best = _results(tmp_path).best_params
    assert set(best) == {"x", "y", "z", "+w"} and abs(best["x"] - best["z"]) <= 0.5


def test_choice_of_lists_and_fixed_values_as_stock(tmp_path):
    db = f"sqlite:///{tmp_path}/s.db"
    sphere(
        tmp_path,
        "hydra.sweeper.n_trials=4",
        f"hydra.sweeper.storage={db}",
        "+v=choice([1,2],[3,4])",
        "z=3",
    )
    for t in optuna.load_study(study_name="sphere", storage=db).trials:
        assert t.params["+v"] in ("[1,2]", "[3,4]")  # sampled as its text, passed as a list
        assert t.user_attrs["z"] == "3"  # a fixed value: a user attribute
        overrides = OmegaConf.load(Path(t.user_attrs["run_dir"], ".hydra", "overrides.yaml"))
        assert f"+v={t.params['+v']}" in overrides and "z=3" in overrides


# The stock grid config (tests/conf/test_grid.yaml): the example's sets a seed, which the grid
# sampler's config has no field for, in the stock plugin as here.
GRID = ["--config-dir=tests/conf", "--config-name=test_grid"]


@pytest.mark.parametrize("name", sampler_names())
def test_every_stock_sampler_option_runs(name, tmp_path):
    grid = GRID if name == "grid" else []
    _, err = sphere(tmp_path, *grid, f"hydra/sweeper/sampler={name}", "hydra.sweeper.n_trials=3")
    assert "Traceback" not in err and _results(tmp_path).trials.COMPLETE == 3


def test_grid_caps_the_trials_at_the_grid_size(tmp_path):
    out, _ = sphere(tmp_path, *GRID, "hydra.sweeper.n_trials=20")
    # x: 2 choices, y: range(-1.0, 1.0, step=1) -> -1.0, 0.0 (a grid's range ends before its
    # upper end, as stock), z: 2 choices
    assert "Updating num of trials to 8 due to using GridSampler." in out
    assert _results(tmp_path).trials.COMPLETE == 8


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ["--config-dir=tests/conf", "--config-name=test_motpe"],
            "The 'motpe' sampler was removed in Optuna 4.0",
        ),
        (["+hydra.sweeper.sampler.priorr=1"], "sampler.priorr=1 is not a parameter of TPESampler"),
    ],
)
def test_rejected_keys_are_one_line(args, needle, tmp_path):
    _, err = sphere(tmp_path, *args, check=False)
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("[")]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err


# -- the same keys beside hpo=optuna (the fake trainer) ----------------------------------------

FAKE = [*procs.FAKE, "-m", "hpo=optuna"]


def fake(tmp_path: Path, *args: str) -> str:
    env = {**os.environ, "FAKE_OUT": str(tmp_path), "PYTHONPATH": str(ROOT)}
    cmd = [
        *FAKE,
        "hpo.study_name=t",
        f"hpo.storage={tmp_path}/study.journal",
        "hpo.tensorboard=false",
        *args,
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def _fake_trials(tmp_path: Path) -> int:
    return len(
        optuna.load_study(study_name="t", storage=journal(f"{tmp_path}/study.journal")).trials
    )


def test_hpo_n_trials_is_a_study_wide_total_and_the_stock_key_means_more_per_run(tmp_path):
    fake(tmp_path, "hpo.n_trials=3")
    fake(tmp_path, "hpo.n_trials=3")
    assert _fake_trials(tmp_path) == 3  # the rerun found the study complete
    fake(tmp_path, "hydra.sweeper.n_trials=2")
    assert _fake_trials(tmp_path) == 5  # set, the stock key means 2 more, as stock


def test_a_chosen_sampler_option_replaces_hpo_sampler(tmp_path):
    out = fake(tmp_path, "hpo.n_trials=2", "hydra/sweeper/sampler=random")
    assert "sampler RandomSampler" in out


def test_n_jobs_beside_hpo_launches_batches_whose_trials_all_report(tmp_path):
    out = fake(tmp_path, "hpo.n_trials=4", "hydra.sweeper.n_jobs=2", "hpo.pruner=none")
    assert re.findall(r"Launching (\d+) jobs locally", out) == ["2", "2"]
    study = optuna.load_study(study_name="t", storage=journal(f"{tmp_path}/study.journal"))
    assert all(t.intermediate_values for t in study.trials)  # each job found its own trial


def test_every_test_the_docs_table_names_exists():
    readme = (ROOT / "docs" / "hpo.md").read_text()
    table = readme[readme.index("| stock key (`hydra.sweeper.*`)") :].split("\n\n")[0]
    named = set(re.findall(r"`(test_\w+)`", table))
    defined = set()
    for path in (ROOT / "tests").glob("test_*.py"):
        defined |= set(re.findall(r"^def (test_\w+)", path.read_text(), re.M))
    assert len(table.splitlines()) >= 18 and named and named <= defined, named - defined
