"""The study optimizes the metric it is asked for: hpo.metric is what each trial returns, in
the direction asked (or the metric's own). Real `python -m app.train -m hpo=optuna` sweeps on
a tiny CPU model, and the composition they rest on."""

from __future__ import annotations

import optuna
import pytest
from omegaconf import OmegaConf

from app.engine.records.summary import Summary
from hydra_plugins.hydratrain_optuna_sweeper._study._checks import check_objectives
from hydra_plugins.hydratrain_optuna_sweeper._study._settings import read_settings
from hydra_plugins.hydratrain_optuna_sweeper._study._stock import StockOptions
from hydra_plugins.hydratrain_optuna_sweeper._study._storage import journal
from tests import procs
from tests.conftest import compose

pytestmark = pytest.mark.integration

TINY_SWEEP = [
    "gpu=cpu",
    "training.max_steps=4",
    "training.eval_every=2",
    "training.eval_samples=8",
    "training.checkpoint_every=0",
    "training.progress_bar=false",
    "training.micro_batch_size=4",
    "data.builtin_num_docs=200",
    "data.seq_len=32",
    "model.n_layer=1",
    "model.n_embd=32",
    "model.n_head=2",
    "hydra.sweeper.params={training.effective_batch_size:'choice(4, 8)'}",
    "hpo.pruner=none",
    "hpo.tensorboard=false",
]


@pytest.mark.parametrize("metric", ["final_val_loss", "tokens_per_sec", "peak_memory_bytes"])
def test_the_job_returns_hpo_metric(metric):
    """conf/train.yaml's own `objective:` came after hpo=optuna's `objective: ${hpo.metric}`."""
    assert compose(["hpo=optuna", f"hpo.metric={metric}"]).objective == metric


@pytest.mark.parametrize(
    ("metric", "direction", "expected"),
    [
        ("final_val_loss", None, "minimize"),
        ("tokens_per_sec", None, "maximize"),  # the metric's own direction
        ("final_val_loss", "maximize", "maximize"),  # as asked, even against its nature
    ],
)
def test_a_null_direction_is_the_metrics_own(metric, direction, expected):
    over = ["hpo=optuna", f"hpo.metric={metric}"]
    over += [f"hpo.direction={direction}"] if direction else []
    cfg = compose(over)
    s = read_settings(StockOptions(stock_node=False), cfg.hpo, "/tmp/sweep")
    check_objectives(cfg, s)
    assert s.directions == [expected]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("metric", "extra", "direction"),
    [
        ("final_val_loss", [], "MINIMIZE"),
        ("tokens_per_sec", ["hpo.direction=maximize"], "MAXIMIZE"),  # the command
        ("final_train_loss", ["hpo.direction=maximize"], "MAXIMIZE"),  # a maximized loss
    ],
)
@pytest.mark.e2e
def test_each_trial_value_is_the_metric_asked_for(metric, extra, direction, tmp_path):
    proc = procs.train(
        "-m",
        "hpo=optuna",
        *TINY_SWEEP,
        "hpo.n_trials=2",
        "hpo.study_name=m",
        f"hpo.storage={tmp_path}/study.journal",
        f"hydra.sweep.dir={tmp_path}/multirun",
        f"data.cache_dir={tmp_path}/cache",
        f"hpo.metric={metric}",
        *extra,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    study = optuna.load_study(study_name="m", storage=journal(f"{tmp_path}/study.journal"))
    assert [d.name for d in study.directions] == [direction]
    trials = study.get_trials()
    assert len(trials) == 2
    for t in trials:
        summary = Summary.read(t.user_attrs["run_dir"])
        assert t.value == pytest.approx(summary.value(metric), rel=1e-12), (metric, t.value)
    results = OmegaConf.load(tmp_path / "multirun" / "optimization_results.yaml")
    best = max if direction == "MAXIMIZE" else min
    assert results.best_value == best(t.value for t in trials)
