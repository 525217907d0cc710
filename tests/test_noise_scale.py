"""training.noise_scale: the estimator against gradients of a known noise scale, the engine's
first-micro-batch gradient against one computed directly, and where it is refused."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from app.config import ConfigError
from app.engine.records.noise_scale import NoiseScale
from app.engine.records.summary import Summary
from app.engine.runner import run_training
from app.engine.train.step import train_step
from tests.conftest import config, tiny
from tests.test_accumulation import _run, _tiny_model_and_blocks

pytestmark = pytest.mark.integration


def _noisy_gradients(steps: int, small: int, big: int, d: int, sigma: float, seed: int):
    """Per-sample gradients G + N(0, sigma^2 I): tr(Sigma) = d sigma^2, |G|^2 = 1. Each step
    yields the squared norm of the first `small` samples' mean and the norm of all `big`'s."""
    g = torch.Generator().manual_seed(seed)
    mean = torch.zeros(d, dtype=torch.float64)
    mean[0] = 1.0
    for _ in range(steps):
        per_sample = mean + sigma * torch.randn(big, d, generator=g, dtype=torch.float64)
        yield per_sample[:small].mean(0).pow(2).sum(), per_sample.mean(0).norm()


@pytest.mark.parametrize(("sigma", "small", "big"), [(0.5, 4, 32), (0.2, 8, 64), (1.0, 2, 16)])
def test_the_estimate_recovers_a_known_noise_scale(sigma, small, big):
    d = 64
    truth = d * sigma**2  # B_simple = tr(Sigma) / |G|^2
    ns = NoiseScale(big, torch.device("cpu"), beta=0.999)
    for small_sq, whole in _noisy_gradients(4000, small, big, d, sigma, seed=0):
        ns.small(small_sq, small)
        ns.step(whole)
    assert ns.value() == pytest.approx(truth, rel=0.1)


def test_the_naive_ratio_of_norms_would_not_recover_it():
    """The check above can fail: |G_B|^2 alone over-states |G|^2 by tr(Sigma)/B, so a ratio
    taken without the two-size correction is off by far more than its tolerance."""
    d, sigma, big = 64, 0.5, 32
    whole_sq = [w.item() ** 2 for _, w in _noisy_gradients(2000, 4, big, d, sigma, seed=1)]
    naive = d * sigma**2 / (sum(whole_sq) / len(whole_sq))  # true trace over the biased |G|^2
    assert naive < 0.7 * d * sigma**2


def test_a_step_records_the_first_micro_batchs_mean_gradient():
    """The gradient backward leaves after the first micro-batch is scaled for the whole step;
    the estimator must get that micro-batch's own mean gradient."""
    model, blocks = _tiny_model_and_blocks()
    reference = copy.deepcopy(model)
    run = _run(model, 8, "sgd")
    recorded = []

    class Recording(NoiseScale):
        def small(self, sq_norm, samples):
            recorded.append((float(sq_norm), samples))
            super().small(sq_norm, samples)

    run.noise = Recording(32, torch.device("cpu"))
    train_step(run, blocks, step=0)
    x, y = run.task.inputs_and_targets(blocks)
    first_x, first_y = next(iter(run.task.micro_batches(x, y, [8, 8, 8, 8])))
    loss = run.task.loss_sum(reference, first_x, first_y) / run.task.units(first_y)
    loss.backward()
    grads = [p.grad for p in reference.parameters() if p.grad is not None]
    expected = float(torch.nn.utils.get_total_norm(grads) ** 2)
    assert len(recorded) == 1 and recorded[0][1] == 8
    assert recorded[0][0] == pytest.approx(expected, rel=1e-5)
    assert run.noise.steps == 1


@pytest.mark.slow
def test_a_run_logs_and_records_the_noise_scale(tmp_path):
    run_dir = tmp_path / "run"
    cfg = config(tiny(tmp_path, "training.noise_scale=true", "training.max_steps=12"))
    summary = run_training(cfg, run_dir)
    assert summary.noise_scale is not None and summary.noise_scale > 0
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    logged = [r["train/noise_scale"] for r in lines if r.get("train/noise_scale") is not None]
    assert logged and logged[-1] == pytest.approx(summary.noise_scale)
    assert Summary.read(run_dir).noise_scale == pytest.approx(summary.noise_scale)


@pytest.mark.slow
def test_auto_micro_batch_leaves_two_micro_batches_per_step_for_it(tmp_path):
    cfg = config(
        tiny(
            tmp_path,
            "training.noise_scale=true",
            "training.micro_batch_size=auto",
            "training.max_steps=2",
        )
    )
    summary = run_training(cfg, tmp_path / "run")
    assert summary.grad_accum_steps >= 2 and summary.micro_batch_size <= 4


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["training.micro_batch_size=8"],
            "training.micro_batch_size=8 is the whole effective batch; allowed: 1..7 (or auto)",
        ),
        (
            ["training.effective_batch_size=1", "training.micro_batch_size=auto"],
            "training.effective_batch_size=1 cannot be split",
        ),
        (["training.parallelism=fsdp"], "allowed with fsdp: false"),
    ],
)
def test_where_it_cannot_be_estimated_it_is_refused_in_one_line(tmp_path, extra, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config(tiny(tmp_path, "training.noise_scale=true", *extra))


def test_an_overflowed_step_leaves_the_estimate_as_it_was():
    ns = NoiseScale(32, torch.device("cpu"))
    for small_sq, whole in _noisy_gradients(50, 4, 32, 64, 0.5, seed=2):
        ns.small(small_sq, 4)
        ns.step(whole)
    before = ns.value()
    ns.small(torch.tensor(float("inf")), 4)  # fp16: the loss scale overflowed this step
    ns.step(torch.tensor(float("inf")))
    assert ns.value() == pytest.approx(before)


def _noise_logged(run_dir) -> dict[int, float]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/noise_scale"] for r in lines if "train/noise_scale" in r}


@pytest.mark.slow
def test_a_resumed_run_goes_on_with_the_estimate_it_had(tmp_path):
    """The averages are in the checkpoint: after a crash and a resume the run logs the noise
    scale the uninterrupted run logs, step for step (it started again from nothing before)."""
    from app.core.outcomes import TrainingOOM

    base = tiny(
        tmp_path,
        "training.noise_scale=true",
        "training.effective_batch_size=16",
        "training.micro_batch_size=4",
        "training.max_steps=10",
        "training.log_every=1",
        "training.checkpoint_every=4",
    )
    straight = run_training(config(base), tmp_path / "straight")
    crash = [
        "faults.oom_above_micro_batch=0",
        "faults.oom_from_step=6",
        "training.auto_batch.oom_recovery=false",
    ]
    with pytest.raises(TrainingOOM):
        run_training(config([*base, *crash]), tmp_path / "first")
    resumed = run_training(
        config([*base, f"training.resume={tmp_path / 'first'}"]), tmp_path / "second"
    )
    start = resumed.resumed_from_step
    assert 0 < start < 10
    after = {s: v for s, v in _noise_logged(tmp_path / "straight").items() if s > start}
    assert after and _noise_logged(tmp_path / "second") == after
    assert resumed.noise_scale == straight.noise_scale
