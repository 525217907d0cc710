"""micro-batch x accumulation == effective batch, exactly; the gradient does not depend on it."""

from __future__ import annotations

import pytest
import torch

from app.components.data.loader import rank_share
from app.components.hardware.precision import PrecisionPlan
from app.components.optim import OPTIMIZERS
from app.components.schedule import build_scheduler
from app.components.tasks.causal_lm import CausalLM
from app.config import TrainingConfig
from app.config.budget import budget_of
from app.engine.batch_plan import BatchPlan, fixed_plan, split_sizes
from app.engine.run import Run
from app.engine.train.step import loss_sum, train_step
from tests.conftest import lm_model

pytestmark = pytest.mark.integration

FP32 = PrecisionPlan("fp32", None, False, False, "test")


@pytest.mark.parametrize(
    ("total", "micro", "expected"),
    [(32, 8, [8, 8, 8, 8]), (32, 32, [32]), (32, 5, [5, 5, 5, 5, 4, 4, 4]), (7, 3, [3, 2, 2])],
)
def test_split_sizes_are_exact_and_within_one(total, micro, expected):
    sizes = split_sizes(total, micro)
    assert sizes == expected
    assert sum(sizes) == total and max(sizes) - min(sizes) <= 1 and max(sizes) <= micro


def test_rank_shares_sum_to_the_effective_batch():
    for total in (8, 31, 32, 100):
        for world in (1, 3, 4, 8):
            if total >= world:
                shares = [rank_share(total, world, r) for r in range(world)]
                assert sum(shares) == total and max(shares) - min(shares) <= 1


def test_plan_never_exceeds_the_rank_share():
    plan = fixed_plan(effective=6, micro=8, world_size=2, rank=1)
    assert plan.micro_sizes == [3] and plan.grad_accum_steps == 1


def _tiny_model_and_blocks(seed: int = 0):
    torch.manual_seed(seed)
    model = lm_model(vocab=64)
    blocks = torch.randint(0, 64, (32, 17))
    # Padding (negative) at the ends of some sequences: target-token counts differ per sample.
    for i in range(32):
        pad = (i * 5) % 13
        if pad:
            blocks[i, -pad:] = -100
    return model, blocks


def _run(model, micro: int, optimizer_kind: str) -> Run:
    tcfg = TrainingConfig(lr=1e-2, warmup_steps=0, max_steps=10, max_grad_norm=0.0)
    if optimizer_kind == "sgd":
        # SGD with lr 1: the step moves each parameter by exactly its gradient, so any error in
        # the loss normalization shows. Adam's first step is ~lr * sign(grad) and would hide it.
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    else:
        optimizer = OPTIMIZERS.get("adamw").create(model, tcfg)
    return Run(
        model=model,
        raw_model=model,
        optimizer=optimizer,
        scheduler=build_scheduler(optimizer, budget_of(tcfg, None)),
        plan=BatchPlan(effective_batch_size=32, micro_batch_size=micro),
        precision=FP32,
        device=torch.device("cpu"),
        cfg=tcfg,
        steps=iter(()),
        val_blocks=torch.zeros(1, 17, dtype=torch.long),
        run_dir=None,
        task=CausalLM(),
        budget=budget_of(tcfg, None),
    )


def _one_step(micro: int, optimizer_kind: str = "sgd") -> dict[str, torch.Tensor]:
    model, blocks = _tiny_model_and_blocks()
    train_step(_run(model, micro, optimizer_kind), blocks, step=0)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_same(
    a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 1e-6
) -> None:
    for name, value in a.items():
        torch.testing.assert_close(b[name], value, rtol=1e-5, atol=atol, msg=name)


@pytest.mark.parametrize("optimizer_kind", ["sgd", "adamw"])
def test_one_step_is_the_same_for_any_micro_batch(optimizer_kind):
    reference = _one_step(32, optimizer_kind)
    # Adam's first step is lr * g / (|g| + eps): for a gradient near zero the float rounding of
    # summing in another order is amplified up to ~1e-6 of a 1e-2 step, so allow 1e-5 there.
    # SGD is the strict check of the normalization.
    atol = 1e-6 if optimizer_kind == "sgd" else 1e-5
    for micro in (8, 5):  # 8 x 4 and the uneven 5,5,5,5,4,4,4
        _assert_same(reference, _one_step(micro, optimizer_kind), atol)


def test_per_micro_batch_averaging_would_differ():
    """The check above can fail: averaging per micro-batch (the old Trainer bug) moves the step."""
    model, blocks = _tiny_model_and_blocks()
    run = _run(model, 8, "sgd")
    x, y = run.task.inputs_and_targets(blocks)
    for i in range(0, 32, 8):
        part = loss_sum(run, x[i : i + 8], y[i : i + 8]) / (y[i : i + 8] != -100).sum()
        (part / 4).backward()
    run.optimizer.step()
    buggy = {k: v.detach().clone() for k, v in model.state_dict().items()}
    with pytest.raises(AssertionError):
        _assert_same(_one_step(8), buggy)
