"""μP's rules (app/components/models/mup/): each kind of parameter's initialization and learning
rate, the attention scale transformers is given, the logits' multiplier, and the export that
folds them into a standard model's weights."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from app.components.models.config import ModelConfig, MupConfig
from app.components.models.families import MODELS, mup_rules
from app.components.models.mup.apply import hidden_matrices, hidden_rates
from app.components.models.mup.attention import attention_modules
from app.components.models.mup.fold import exported_weights
from app.components.optim import OPTIMIZERS
from app.components.tasks.base import TaskData
from app.components.tasks.causal_lm import CausalLM
from app.config.training import TrainingConfig

pytestmark = pytest.mark.unit

VOCAB = 64


def model_config(arch: str = "gpt2", width: int = 128, base: int | None = 32, **kw) -> ModelConfig:
    mup = "standard" if base is None else "mup"
    return ModelConfig(
        name="t", arch=arch, n_layer=2, n_head=4, n_embd=width, max_position_embeddings=32,
        parametrization=mup, mup=MupConfig(base_width=base), **kw,
    )  # fmt: skip


def build(m: ModelConfig, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    empty = torch.empty(0, dtype=torch.long)
    return MODELS.get(m.arch).build(m, TaskData(empty, empty, VOCAB, "test"), CausalLM())


def optimizer(model, m: ModelConfig, name: str, lr: float = 1e-3, wd: float = 0.1):
    t = TrainingConfig(optimizer=name, lr=lr, weight_decay=wd)
    rules = MODELS.get(m.arch).mup
    hidden = hidden_rates(model, m, rules) if m.parametrization == "mup" else None
    return OPTIMIZERS.get(name).create(model, t, hidden)


def names(model, group) -> set[str]:
    ids = {id(p) for p in group["params"]}
    return {n for n, p in model.named_parameters() if id(p) in ids}


@pytest.mark.parametrize("name", OPTIMIZERS.names())
def test_each_hidden_group_runs_at_the_rate_divided_by_its_width_multiplier(name):
    exponent = OPTIMIZERS.get(name).mup_exponent  # 1, or 0.5 where the step is relative
    m = model_config(width=128, base=32)  # width_mult 4, the MLP's inner width too
    model = build(m)
    groups = optimizer(model, m, name).param_groups
    inputs, hidden, vectors = groups
    assert names(model, inputs) == {"transformer.wte.weight", "transformer.wpe.weight"}
    assert inputs["lr"] == 1e-3 and inputs["weight_decay"] == 0.1  # embeddings: as given
    assert names(model, hidden) == {n for n, p in model.named_parameters() if p.dim() == 2} - {
        "transformer.wte.weight", "transformer.wpe.weight"}  # fmt: skip
    assert hidden["lr"] == pytest.approx(1e-3 / 4**exponent)
    # lr x weight_decay, the decay per step, as at the base width
    assert hidden["lr"] * hidden["weight_decay"] == pytest.approx(1e-3 * 0.1)
    assert all(p.dim() == 1 for p in vectors["params"]) and vectors["weight_decay"] == 0.0
    assert vectors["lr"] == 1e-3  # biases and norm gains: as given
    counted = sum(len(g["params"]) for g in groups)
    assert counted == len(list(model.parameters()))  # each parameter once (tied: once)


def test_a_matrix_is_divided_by_its_own_fan_ins_multiplier():
    # Llama's MLP width is rounded to 256: 512 at width 128, 256 at the base width 32.
    m = model_config("llama", width=128, base=32)
    model = build(m)
    groups = optimizer(model, m, "adamw").param_groups
    by_rate = {round(g["lr"] * 1e3, 6): names(model, g) for g in groups[1:-1]}
    assert sorted(by_rate) == [0.25, 0.5]
    assert all("down_proj" in n for n in by_rate[0.5])
    assert not [n for n in by_rate[0.25] if "down_proj" in n]


def test_the_standard_parametrization_keeps_its_two_groups():
    m = model_config(base=None)
    model = build(m)
    groups = optimizer(model, m, "adamw").param_groups
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
    assert all(g["lr"] == 1e-3 for g in groups)


def test_hidden_matrices_start_at_the_base_widths_scale_and_embeddings_as_they_are():
    standard, mup = build(model_config(width=256, base=None)), build(model_config(width=256))
    hidden = {id(p) for p, _ in hidden_matrices(mup)}
    for (name, s), p in zip(standard.named_parameters(), mup.parameters(), strict=True):
        if p.dim() < 2:
            continue
        ratio = float(p.detach().std() / s.detach().std())
        expected = 0.125**0.5 if id(p) in hidden else 1.0  # width_mult 8: std / sqrt(8)
        assert ratio == pytest.approx(expected, rel=0.05), name


def test_gpt2s_attention_uses_attn_mult_times_the_base_head_widths_root_over_the_head_width():
    """The private use (app/components/models/mup/attention.py): the scores GPT-2 computes
    follow the `scaling` set on its attention modules: attn_mult x sqrt(base_head_dim) / d_head
    (head width 16 here, stated at a base head width of 4: the scale 3 x 2 / 16)."""
    m = dataclasses.replace(model_config(width=64, base=32), attn_implementation="eager")
    m = dataclasses.replace(m, mup=MupConfig(base_width=32, base_head_dim=4, attn_mult=3.0))
    model = build(m).eval()
    assert [a.scaling for a in attention_modules(model, "GPT2Attention")] == [3.0 * 2 / 16] * 2
    x = torch.randint(0, VOCAB, (2, 10))
    out = model(input_ids=x, output_attentions=True)
    block = model.transformer.h[0]
    h = block.ln_1(model.transformer.wte(x) + model.transformer.wpe(torch.arange(10)))
    q, k, _ = block.attn.c_attn(h).split(64, dim=2)
    q, k = (t.view(2, 10, 4, 16).transpose(1, 2) for t in (q, k))
    scores = (q @ k.transpose(-1, -2)) * 3.0 * 2 / 16
    scores = scores.masked_fill(torch.ones(10, 10, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(out.attentions[0], scores.softmax(-1), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(
    ("width", "heads", "base_head_dim", "scale"),
    [
        (32, 1, None, 32**-0.5),  # heads scaled with the width: the standard scale at each width
        (128, 4, None, 32**-0.5),
        (32, 2, 16, 16**-0.5),  # at the base head width: the standard scale
        (64, 2, 16, 16**-0.5 / 2),  # the head width doubled: the scale halves (1/d_head)
        (128, 2, 16, 16**-0.5 / 4),
    ],
)
def test_the_attention_is_the_standard_one_at_the_base_head_width_and_follows_1_over_d_head(
    width, heads, base_head_dim, scale
):
    m = dataclasses.replace(
        model_config(width=width, base=32),
        n_head=heads,
        mup=MupConfig(32, base_head_dim=base_head_dim),
    )
    scales = [a.scaling for a in attention_modules(build(m), "GPT2Attention")]
    assert scales == [pytest.approx(scale, rel=1e-12)] * 2


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_mup_at_its_base_width_computes_the_standard_models_logits(arch):
    """width_mult 1: every rule is the identity there, the attention scale included."""
    m = dataclasses.replace(model_config(arch, width=64, base=64), attn_implementation="eager")
    mup = build(m).eval()
    with torch.no_grad():  # weights away from their initialization, as training leaves them
        for p in mup.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    standard = build(dataclasses.replace(m, parametrization="standard")).eval()
    standard.load_state_dict(mup.state_dict())
    x = torch.randint(0, VOCAB, (2, 16))
    got, want = mup(input_ids=x).logits, standard(input_ids=x).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_the_export_folds_mup_into_a_standard_models_weights(arch, attn):
    m = ModelConfig(
        name="t", arch=arch, n_layer=2, n_head=4, n_embd=128, max_position_embeddings=32,
        attn_implementation=attn, parametrization="mup",
        mup=MupConfig(base_width=32, output_mult=2.0, base_head_dim=8, attn_mult=1.5),
    )  # fmt: skip
    trained = build(m).eval()
    with torch.no_grad():  # weights away from their initialization, as training leaves them
        for p in trained.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    standard = build(dataclasses.replace(m, parametrization="standard")).eval()
    standard.load_state_dict(exported_weights(trained, m, MODELS.get(arch).mup))
    x = torch.randint(0, VOCAB, (2, 16))
    want = trained(input_ids=x).logits
    torch.testing.assert_close(standard(input_ids=x).logits, want, atol=1e-5, rtol=1e-4)
    # The model itself is untouched: its own weights still compute its own logits.
    torch.testing.assert_close(trained(input_ids=x).logits, want, atol=0, rtol=0)


def test_only_a_mup_model_has_rules_to_fold():
    assert mup_rules(model_config(base=None)) is None  # the export writes its weights as they are
    assert mup_rules(model_config(base=32)) is MODELS.get("gpt2").mup


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
def test_every_schedule_keeps_the_hidden_groups_rate_in_proportion(schedule):
    from app.components.schedule import build_scheduler
    from app.config.budget import budget_of

    m = model_config(width=128, base=32)
    model = build(m)
    t = TrainingConfig(lr=1e-3, schedule=schedule, warmup_steps=2, max_steps=10)
    opt = OPTIMIZERS.get("adamw").create(model, t, hidden_rates(model, m, MODELS.get("gpt2").mup))
    scheduler = build_scheduler(opt, budget_of(t, None))
    for _ in range(6):
        opt.step()
        scheduler.step()
        inputs, hidden = opt.param_groups[0]["lr"], opt.param_groups[1]["lr"]
        assert hidden == pytest.approx(inputs / 4)
