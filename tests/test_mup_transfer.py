"""Tune small, train large: a μP study on a proxy records its parametrization, gives the command
that trains the target width with its best configuration (and runs it, hpo.transfer.run), and a
warm start takes values as they are only between studies of one parametrization."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.distributions import FloatDistribution

from app.config.hpo import WarmStartConfig
from app.studies.transfer import RECORD, Parametrization, target_overrides
from hydra_plugins.hydratrain_optuna_sweeper._errors import SweepConfigError
from hydra_plugins.hydratrain_optuna_sweeper._study._storage import Masker, journal
from hydra_plugins.hydratrain_optuna_sweeper._study._warm_start import Target, plan_warm_start

pytestmark = pytest.mark.integration

MUP_32 = Parametrization("mup", base_width=32, width=32)
HEADS_16 = Parametrization("mup", base_width=32, width=32, base_head_dim=16)
# A μP study recorded before the base head width: its attention was attn_mult / d_head
OLD_MUP = {"name": "mup", "base_width": 32, "width": 32, "target": []}
SPACE = {"training.lr": FloatDistribution(1e-4, 1e-1, log=True)}


def _source(tmp_path: Path, record: Parametrization | dict[str, object] | None) -> str:
    """A finished study of four learning rates (best: 0.003), recorded as `record` (None: a
    study from before the record, i.e. of the standard parametrization; a dict: as stored)."""
    path = str(tmp_path / "old.journal")
    study = optuna.create_study(study_name="old", storage=journal(path))
    for lr, value in ((0.001, 2.0), (0.003, 1.5), (0.01, 1.8), (0.03, 3.0)):
        study.add_trial(
            optuna.trial.create_trial(params={"training.lr": lr}, distributions=SPACE, value=value)
        )
    if record is not None:
        study.set_user_attr(RECORD, record if isinstance(record, dict) else record.attrs())
    return path


def _plan(path: str, here: Parametrization, take: str = "enqueue", **settings):
    cfg = WarmStartConfig(studies=[{"storage": path, "study_name": "old"}], take=take, **settings)
    return plan_warm_start(cfg, Target(dict(SPACE), ["minimize"], parametrization=here), Masker())


@pytest.mark.unit
def test_a_mup_proxys_values_enter_a_mup_target_as_they_are(tmp_path):
    target = Parametrization("mup", base_width=32, width=128)  # the same base width, wider
    path = _source(tmp_path, MUP_32)
    enqueued = _plan(path, target, top_k=1)
    assert enqueued is not None and enqueued.enqueued[0][0] == {"training.lr": 0.003}
    observed = _plan(path, target, take="observe")
    assert observed is not None
    assert sorted(t.params["training.lr"] for t in observed.observed) == [0.001, 0.003, 0.01, 0.03]
    assert sorted(t.value for t in observed.observed) == [1.5, 1.8, 2.0, 3.0]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("source", "here", "needle"),
    [
        (None, MUP_32, "was run under model.parametrization=standard, this study under μP at "
         "width 32 (model.mup.base_width=32)"),
        (MUP_32, Parametrization(), "was run under μP at width 32 (model.mup.base_width=32), "
         "this study under model.parametrization=standard"),
        (MUP_32, Parametrization("mup", base_width=64, width=64),
         "states its hyperparameters at model.mup.base_width=32, this study at 64"),
        (HEADS_16, Parametrization("mup", base_width=32, width=128, base_head_dim=32),
         "states its attention at head width 16 (model.mup.base_head_dim), this study at 32"),
        (OLD_MUP, HEADS_16, "states its attention at head width 1 (model.mup.base_head_dim), "
         "this study at 16"),
    ],
)  # fmt: skip
def test_values_of_another_parametrization_are_refused_unless_asked(source, here, needle, tmp_path):
    path = _source(tmp_path, source)
    with pytest.raises(SweepConfigError, match="across_parametrizations=true") as refused:
        _plan(path, here)
    assert needle in str(refused.value)
    taken = _plan(path, here, across_parametrizations=True)
    assert taken is not None and taken.enqueued[0][0] == {"training.lr": 0.003}


@pytest.mark.unit
def test_the_targets_overrides_replace_the_proxys_and_export_it():
    trial = ["training.lr=0.003", "model.n_embd=64", "+model.n_head=2", "training.export=false"]
    target = ["model.n_embd=512", "model.n_head=16"]
    assert target_overrides(trial, target) == [
        "training.lr=0.003", "training.export=false", *target, "training.export=true"
    ]  # fmt: skip
    assert target_overrides(trial, ["training.export=false"])[-1] == "training.export=false"


TINY_PROXY = [
    "-m",
    "+sweeps=mup_transfer",
    "gpu=cpu",
    "model.n_layer=1",
    "model.n_embd=32",
    "model.n_head=2",
    "model.mup.base_width=32",
    "data.seq_len=32",
    "data.builtin_num_docs=300",
    "training.default_budget=steps",
    "training.max_steps=6",
    "training.eval_every=3",
    "training.eval_samples=8",
    "training.micro_batch_size=8",
    "hpo.n_trials=2",
    "hpo.sampler=random",
    'hpo.transfer.target=["model.n_embd=64","model.n_head=4"]',
]


def _sweep(argv: list[str], monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", ["app.train", *argv])
    try:
        runpy.run_module("app.train", run_name="__main__", alter_sys=True)
    except SystemExit as done:
        assert done.code in (0, None)


def test_a_proxy_study_gives_and_runs_the_targets_command(tmp_path, monkeypatch, capfd):
    sweep, storage = tmp_path / "sweep", tmp_path / "study.journal"
    where = [f"hpo.storage={storage}", f"hydra.sweep.dir={sweep}", f"data.cache_dir={tmp_path}/c"]
    _sweep([*TINY_PROXY, *where], monkeypatch)
    out = capfd.readouterr()

    study = optuna.load_study(
        study_name="mup_proxy-tiny_gpt2-tiny_corpus", storage=journal(str(storage))
    )
    recorded = Parametrization.of(study.user_attrs)
    # head width 16, the proxy's and the target's: null means each model's own, the same here
    target = ("model.n_embd=64", "model.n_head=4")
    assert recorded == Parametrization("mup", 32, 32, target, base_head_dim=16)
    lines = (out.out + out.err).splitlines()
    first = next(line for line in lines if "μP at width 32 (model.mup.base_width=32)" in line)
    assert "the target (model.n_embd=64 model.n_head=4) trains with" in first

    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    transfer, best = results["transfer"], results["best_params"]
    assert transfer["base_width"] == 32 and transfer["proxy_width"] == 32
    assert transfer["base_head_dim"] == 16
    command = transfer["command"].split()
    assert command[:3] == ["python", "-m", "app.train"]
    assert {f"{k}={v}" for k, v in best.items()} <= set(command)  # the best values as they are
    # μP's multipliers are searched beside the default space, and handed on like the rate
    assert {"model.mup.output_mult", "model.mup.attn_mult", "training.lr"} <= set(best)
    assert config_of_target_has_multipliers(sweep, best)
    assert command[-3:] == ["model.n_embd=64", "model.n_head=4", "training.export=true"]
    assert "model.n_embd=32" not in command and not any(c.startswith("hpo.") for c in command)

    # hpo.transfer.run: the target trained once, with exactly that command's overrides.
    run = transfer["run"]
    assert run["status"] == "completed" and run["run_dir"] == str(sweep / "target")
    ran = yaml.safe_load((sweep / "target" / ".hydra" / "overrides.yaml").read_text())
    assert ran == command[3:]
    config = yaml.safe_load((sweep / "target" / ".hydra" / "config.yaml").read_text())
    assert config["model"]["n_embd"] == 64 and config["model"]["parametrization"] == "mup"
    assert (sweep / "target" / "model" / "model.safetensors").is_file()
    assert transfer["command"] in (sweep / "report.html").read_text().replace("&#x27;", "'")


def config_of_target_has_multipliers(sweep, best) -> bool:
    config = yaml.safe_load((sweep / "target" / ".hydra" / "config.yaml").read_text())
    mup = config["model"]["mup"]
    return (mup["output_mult"], mup["attn_mult"]) == (
        best["model.mup.output_mult"],
        best["model.mup.attn_mult"],
    )
