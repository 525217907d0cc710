"""Optimizers by name (app/components/optim/): each trains the default model, is counted by the
memory preflight with its own state size, keys its own micro-batch cache entries (tested in
test_autobatch.py) and checks its own settings."""

from __future__ import annotations

import pytest
import torch

from app.components.models.families import MODELS
from app.components.optim import OPTIMIZERS
from app.config import ConfigError, TrainingConfig, load_config
from app.engine.runner import run_training
from app.engine.start_checks import GIB, check_model_fits
from tests.conftest import compose, config, lm_model, tiny

pytestmark = pytest.mark.integration

GPT2_SMALL = ["model=gpt2_small", "data.tokenizer=train", "data.tokenizer_vocab_size=50257"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("choice", "drop"),
    [
        (["training.optimizer=lion"], 1.0),
        (["training=lion"], 0.5),
        # AdamW's learning rate is small for Adafactor's relative steps: it learns, slowly
        (["training.optimizer=adafactor"], 0.02),
        (["training=adafactor"], 1.0),
    ],
)
def test_each_optimizer_trains_the_default_model(tmp_path, choice, drop):
    overrides = tiny(tmp_path, "training.max_steps=30", "training.eval_every=15", *choice)
    summary = run_training(config(overrides), tmp_path / "run")
    assert summary.status == "completed"
    assert summary.final_val["loss"] < summary.initial_val["loss"] - drop


@pytest.mark.parametrize(
    ("name", "state_type"),
    [("adamw", torch.optim.AdamW), ("adafactor", torch.optim.Adafactor)],
)
def test_the_name_builds_that_optimizer_with_the_runs_settings(name, state_type):
    training = TrainingConfig(optimizer=name, lr=2e-3, weight_decay=0.05)
    opt = OPTIMIZERS.get(name).create(lm_model(), training)
    assert isinstance(opt, state_type)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.05, 0.0]  # matrices only
    assert all(g["lr"] == 2e-3 for g in opt.param_groups)


@pytest.mark.parametrize("name", OPTIMIZERS.names())
def test_every_optimizer_keeps_no_more_state_than_it_says_and_decays_matrices_only(name):
    """What an optimizer says of itself holds, for each one registered (a new one too): its
    state after a step is at most `state_bytes_per_param` (the memory preflight counts it)."""
    model = lm_model()
    opt = OPTIMIZERS.get(name).create(model, TrainingConfig(optimizer=name, weight_decay=0.1))
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    assert all(p.dim() >= 2 for p in opt.param_groups[0]["params"])
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.dim()]
    held = sum(t.numel() * t.element_size() for t in state)
    assert held <= OPTIMIZERS.get(name).state_bytes_per_param * sum(
        p.numel() for p in model.parameters()
    )


def test_lion_keeps_one_moment_and_moves_each_weight_by_the_learning_rate():
    model = lm_model()
    training = TrainingConfig(optimizer="lion", lr=1e-3, weight_decay=0.0, betas=[0.9, 0.99])
    opt = OPTIMIZERS.get("lion").create(model, training)
    before = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    for old, p in zip(before, model.parameters(), strict=True):
        # sign(interpolated momentum) * lr: every weight moves by exactly lr
        torch.testing.assert_close((p.detach() - old).abs(), torch.full_like(old, 1e-3))
        assert list(opt.state[p]) == ["exp_avg"]


def test_adafactor_keeps_factored_state():
    model = lm_model()
    opt = OPTIMIZERS.get("adafactor").create(model, TrainingConfig(optimizer="adafactor"))
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    matrix = next(p for p in model.parameters() if p.dim() == 2)
    state_numel = sum(t.numel() for t in opt.state[matrix].values() if torch.is_tensor(t))
    assert state_numel < matrix.numel() / 10  # rows + columns, not one per weight


@pytest.mark.parametrize(("name", "label", "state"), [("adamw", "AdamW", 8), ("lion", "Lion", 4)])
def test_the_memory_preflight_counts_each_optimizers_own_state(name, label, state):
    cfg = load_config(compose([*GPT2_SMALL, f"training.optimizer={name}"]))
    params = MODELS.get("gpt2").parameters(cfg.model, cfg.model.vocab_size or 256)
    need = params * (8 + state)
    check_model_fits(cfg, need + 1, "cpu")  # just enough: passes
    with pytest.raises(ConfigError, match=f"weights, gradients and {label} state") as err:
        check_model_fits(cfg, need - GIB // 8, "cpu")
    assert f"{need / GIB:,.1f} GiB" in str(err.value)


def test_adafactor_fits_where_adamw_does_not():
    adamw = load_config(compose([*GPT2_SMALL, "training.optimizer=adamw"]))
    adafactor = load_config(compose([*GPT2_SMALL, "training.optimizer=adafactor"]))
    params = MODELS.get("gpt2").parameters(adamw.model, adamw.model.vocab_size or 256)
    memory = params * 12  # fp32 weights + grads + 4 bytes: too little for AdamW's 8
    with pytest.raises(ConfigError, match="AdamW state"):
        check_model_fits(adamw, memory, "cpu")
    check_model_fits(adafactor, memory, "cpu")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["training.optimizer=sgd"], "training.optimizer='sgd' is not allowed; choose one of: "),
        (
            ["training.optimizer=adafactor", "+training.optimizer_args={beta2_decay: 0.5}"],
            r"training.optimizer_args.beta2_decay=0.5 must be a finite number <= 0$",
        ),
        (
            ["training.optimizer=adafactor", "+training.optimizer_args={beta3: 1}"],
            "training.optimizer_args.beta3: no such setting of training.optimizer=adafactor",
        ),
        (
            ["training.optimizer=lion", "+training.optimizer_args={d: 1}"],
            "training.optimizer_args.d: no such setting of training.optimizer=lion; known: none",
        ),
        (["training.optimizer=lion", "training.betas=[0.9,1.5]"], r"training.betas=\[0.9, 1.5\]"),
    ],
)
def test_an_optimizers_settings_are_checked_with_the_config(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(compose(overrides))


def test_the_optimizer_is_a_choice_a_sweep_can_search(tmp_path):
    """`training.optimizer=choice(adamw,lion)`: each value is a config the sweeper's check of
    the search space composes and passes."""
    for name in OPTIMIZERS.names():
        assert load_config(compose([f"training.optimizer={name}"])).training.optimizer == name
