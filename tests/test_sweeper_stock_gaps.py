"""Configs written for the stock hydra-optuna-sweeper, tried as a new user would, with the files
in tests/stock_configs: a search that names the stock plugin's class path (as
lightning-hydra-template's hparams_search configs do), with and without the stock plugin
installed; the legacy `hydra.sweeper.search_space` node; and the exit status of a study in
which no trial completed. The fake trainer (tests/fake_app) and the stock example
(tests/stock_optuna) run them."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from omegaconf import OmegaConf
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from hydra_plugins.hydratrain_optuna_sweeper._study._storage import journal
from tests import procs

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "stock_configs"
FAKE_STOCK = ROOT / "tests" / "fake_stock_plugin"  # a regular package of the stock's name
STOCK_EXAMPLES = ROOT / "tests" / "stock_optuna"
STOCK_CLASS = "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"
# hydra-optuna-sweeper 1.3.0's words (its _impl.py), which ours repeats
STOCK_DEPRECATION = (
    "`hydra.sweeper.search_space` is deprecated and will be removed in the next major release."
    "\nPlease configure with `hydra.sweeper.params`."
    "\nhttps://hydra.cc/docs/upgrades/1.1_to_1.2/changes_to_sweeper_config/\n"
)
optuna.logging.set_verbosity(optuna.logging.WARNING)


def _run(
    cmd: list[str], tmp_path: Path, cwd: Path = ROOT, path: tuple[Path, ...] = (ROOT,)
) -> subprocess.CompletedProcess[str]:
    env = procs.environment(out=tmp_path, path=path)
    env.pop("HYDRA_DEPRECATION_WARNINGS_AS_ERRORS", None)
    return procs.run(cmd, cwd=cwd, env=env)


def fake(tmp_path: Path, *args: str, path: tuple[Path, ...] = (ROOT,)):
    """python tests/fake_app/fake_train.py -m --config-dir tests/stock_configs ARGS"""
    cmd = [*procs.FAKE, "-m", "--config-dir", str(CONFIGS), *args]
    return _run(cmd, tmp_path, path=path)


def _messages(stderr: str) -> list[str]:
    """stderr less Hydra's log lines (they start with a [timestamp])."""
    return [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith("[")]


def _results(tmp_path: Path):
    return OmegaConf.load(tmp_path / "multirun" / "optimization_results.yaml")


# -- hydra.sweeper._target_: the stock plugin's class path ---------------------------------------


@pytest.mark.slow
def test_a_templates_stock_class_path_runs_this_sweeper_without_the_stock_plugin(tmp_path):
    proc = fake(tmp_path, "+hparams_search=optuna_class_path")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = _results(tmp_path)
    # this sweeper (its own results keys) with the stock node's meaning: in memory, 4 more
    assert results.study_name and results.storage == "memory"
    assert results.trials == {"COMPLETE": 4} and set(results.best_params) == {
        "training.lr",
        "training.effective_batch_size",
        "training.weight_decay",
    }


_DISCOVERY = f"""
import inspect
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
for cls in Plugins.instance().discover(Sweeper):
    if f"{{cls.__module__}}.{{cls.__qualname__}}" == "{STOCK_CLASS}":
        print("registered:", inspect.getfile(cls))
"""


@pytest.mark.slow
@pytest.mark.parametrize("stock_first", [False, True])
def test_with_the_stock_plugin_installed_its_class_path_runs_the_stock_plugin(
    stock_first, tmp_path
):
    # The stock's regular package wins wherever it is on the path; scanned first (as in one
    # site-packages, where it sorts before ours), its config node is not replaced by ours.
    path = (FAKE_STOCK, ROOT) if stock_first else (ROOT, FAKE_STOCK)
    stock_module = FAKE_STOCK / "hydra_plugins" / "hydra_optuna_sweeper" / "optuna_sweeper.py"
    proc = fake(tmp_path, "+hparams_search=optuna_class_path", path=path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"fake stock sweeper ran: {stock_module}" in proc.stdout
    assert not (tmp_path / "multirun" / "optimization_results.yaml").exists()  # ours writes it
    found = _run([sys.executable, "-c", _DISCOVERY], tmp_path, path=path)
    assert found.stdout.splitlines() == [f"registered: {stock_module}"], found.stderr[-3000:]
    # and the group option is the stock's too (ours would end this one with status 1)
    proc = fake(tmp_path, "+hparams_search=no_trial_completes", "hydra/sweeper=optuna", path=path)
    assert proc.returncode == 0 and f"fake stock sweeper ran: {stock_module}" in proc.stdout


@pytest.mark.slow
def test_the_stand_in_refuses_to_take_the_place_of_the_stock_plugins_own_module(tmp_path):
    # What a non-editable install of hydratrain over the stock plugin's files would leave.
    package = tmp_path / "site" / "hydra_plugins" / "hydra_optuna_sweeper"
    shutil.copytree(FAKE_STOCK / "hydra_plugins" / "hydra_optuna_sweeper", package)
    shutil.copy(ROOT / "hydra_plugins" / "hydra_optuna_sweeper" / "optuna_sweeper.py", package)
    code = "import hydra_plugins.hydra_optuna_sweeper.optuna_sweeper"
    proc = _run([sys.executable, "-c", code], tmp_path, path=(tmp_path / "site", ROOT))
    assert proc.returncode != 0
    assert "replaced the stock plugin's own module: reinstall hydra-optuna-sweeper" in proc.stderr


def test_the_package_ships_the_stock_class_path_as_a_namespace_portion():
    from setuptools import find_namespace_packages

    pyproject = (ROOT / "pyproject.toml").read_text()
    find = pyproject[pyproject.index("[tool.setuptools.packages.find]") :].split("\n\n")[0]
    assert "namespaces = true" in find  # so setuptools runs find_namespace_packages
    include = re.findall(r'"([^"]+)"', find.split("include = ", 1)[1].split("\n")[0])
    packages = find_namespace_packages(where=str(ROOT), include=include)
    assert "hydra_plugins.hydra_optuna_sweeper" in packages
    # no __init__.py: an installed stock plugin's regular package takes precedence
    assert not (ROOT / "hydra_plugins" / "hydra_optuna_sweeper" / "__init__.py").exists()


# -- hydra.sweeper.search_space: the legacy node --------------------------------------------------


@pytest.mark.slow
def test_the_legacy_search_space_node_runs_with_the_stock_warning(tmp_path):
    db = f"sqlite:///{tmp_path}/s.db"
    cmd = [
        sys.executable,
        "example/sphere.py",
        "--multirun",
        f"--config-dir={CONFIGS}",
        "--config-name=legacy_search_space",
        f"hydra.sweep.dir={tmp_path}/sweep",
        "hydra.job.chdir=True",
        "hydra.sweeper.n_trials=6",
        f"hydra.sweeper.storage={db}",
        "y=choice(-1, 1)",  # as stock: the command line replaces a key of the legacy space
    ]
    proc = _run(cmd, tmp_path, cwd=STOCK_EXAMPLES)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"UserWarning: {STOCK_DEPRECATION}" in proc.stderr
    trials = optuna.load_study(study_name="sphere", storage=db).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 6
    assert trials[0].distributions == {
        "x": FloatDistribution(-5.5, 5.5, step=0.5),
        "y": CategoricalDistribution([-1, 1]),
        "z": CategoricalDistribution(["foo", "bar"]),
        "lr": FloatDistribution(1e-4, 1e-1, log=True),
        "width": IntDistribution(8, 64, log=True),  # with log, step is ignored, as stock
    }
    for t in trials:  # each job got its values
        overrides = OmegaConf.load(Path(t.user_attrs["run_dir"], ".hydra", "overrides.yaml"))
        assert f"z={t.params['z']}" in overrides and f"width={t.params['width']}" in overrides


@pytest.mark.slow
def test_a_bad_legacy_entry_is_one_line_and_status_2(tmp_path):
    cmd = [
        sys.executable,
        "example/sphere.py",
        "--multirun",
        f"--config-dir={CONFIGS}",
        "--config-name=legacy_search_space",
        f"hydra.sweep.dir={tmp_path}/sweep",
        "hydra.sweeper.search_space.x.type=normal",
    ]
    proc = _run(cmd, tmp_path, cwd=STOCK_EXAMPLES)
    errors = [ln for ln in _messages(proc.stderr) if ln.startswith("error")]  # beside warnings
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert errors == [
        "error: hydra.sweeper.search_space.x.type='normal' is not allowed; choose one of: "
        "int, float, categorical"
    ], proc.stderr[-3000:]
    assert not (tmp_path / "sweep").exists()


# -- a study in which no trial completed: exit status 1 -------------------------------------------

NO_TRIAL = re.compile(
    r"error: no trial of study '[^']+' completed \(trials by state: "
    r"(?P<counts>(FAIL|PRUNED): \d+(, PRUNED: \d+)?)\)"
)


def _hpo_study(tmp_path: Path) -> tuple[str, ...]:
    storage = f"{tmp_path}/study.journal"
    return ("hpo=optuna", f"hpo.storage={storage}", "hpo.study_name=t", "hpo.tensorboard=false")


@pytest.mark.slow
@pytest.mark.parametrize("node", ["stock", "hpo"])
def test_a_study_in_which_no_trial_completed_ends_with_status_1_and_one_line(node, tmp_path):
    sweeper = ("hydra/sweeper=optuna",) if node == "stock" else _hpo_study(tmp_path)
    proc = fake(tmp_path, "+hparams_search=no_trial_completes", *sweeper)
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = _messages(proc.stderr)
    assert len(lines) == 1 and (match := NO_TRIAL.fullmatch(lines[0])), proc.stderr[-3000:]
    assert sum(int(n) for n in re.findall(r"\d+", match["counts"])) == 4
    results = _results(tmp_path)  # still written, without a best value
    assert "best_value" not in results and sum(results.trials.values()) == 4


@pytest.mark.slow
def test_a_rerun_adding_only_failures_to_a_study_with_a_completed_trial_ends_with_0(tmp_path):
    study = _hpo_study(tmp_path)
    ok = ("fake.error_above_lr=null", "fake.oom_above_batch=null")
    first = fake(tmp_path, "+hparams_search=no_trial_completes", *study, *ok)
    assert first.returncode == 0, first.stderr[-3000:]
    rerun = fake(tmp_path, "+hparams_search=no_trial_completes", *study)
    assert rerun.returncode == 0 and not _messages(rerun.stderr), rerun.stderr[-3000:]
    trials = optuna.load_study(study_name="t", storage=journal(f"{tmp_path}/study.journal")).trials
    assert len(trials) == 8 and TrialState.COMPLETE in {t.state for t in trials[:4]}
    assert {t.state for t in trials[4:]} <= {TrialState.FAIL, TrialState.PRUNED}


def _first_trial_reporting(storage: str, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            trials = optuna.load_study(study_name="t", storage=journal(storage)).get_trials()
        except (KeyError, OSError):  # the journal or the study is not there yet
            trials = []
        if trials and trials[0].intermediate_values:
            return
        time.sleep(0.1)
    raise AssertionError("the first trial never reported")


@pytest.mark.slow
def test_a_worker_stopped_before_any_trial_completed_ends_with_its_signal_status(tmp_path):
    cmd = [*procs.FAKE, "-m", *_hpo_study(tmp_path), "hpo.n_trials=2"]
    cmd += ["hpo.pruner=none", "fake.step_sleep=0.3"]  # 5 evaluations: 1.5 s a trial
    env = {**os.environ, "FAKE_OUT": str(tmp_path), "PYTHONPATH": str(ROOT)}
    worker = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    _first_trial_reporting(f"{tmp_path}/study.journal")
    worker.send_signal(signal.SIGTERM)  # the trial is preempted: FAIL, queued again
    _, err = worker.communicate(timeout=60)
    assert worker.returncode == 128 + signal.SIGTERM, err[-3000:]
    lines = _messages(err)
    assert len(lines) == 1 and lines[0].startswith("stopped: SIGTERM: "), err[-3000:]
