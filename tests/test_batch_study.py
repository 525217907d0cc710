"""The batch-size study's analysis against curves of a known critical batch size, and the
study end to end: `+sweeps=batch_size` on the tiny model."""

from __future__ import annotations

import pytest
import yaml

from app.studies.batch_size import BatchTrial, analyse, plot, samples_to, table
from tests import procs
from tests.conftest import ROOT

pytestmark = pytest.mark.integration

S_MIN, B_CRIT = 100.0, 24.0
E_MIN = S_MIN * B_CRIT
TARGET = 1.0


def _curve(batch: int, lr_penalty: float = 1.0, every: int = 8) -> list[tuple[int, float]]:
    """A learning curve that reaches TARGET after E_min (1 + B / B_crit) samples (McCandlish
    et al.), later by `lr_penalty` at a worse learning rate, reported every `every` samples."""
    reach = E_MIN * (1 + batch / B_CRIT) * lr_penalty
    return [(s, TARGET * reach / s) for s in range(every, int(reach * 2), every)]


def _trial(batch: int, lr: float, penalty: float = 1.0, **kw) -> BatchTrial:
    curve = _curve(batch, penalty)
    return BatchTrial(batch=batch, lr=lr, final_loss=curve[-1][1], curve=curve, **kw)


def test_where_a_curve_reaches_the_target_is_interpolated_between_reports():
    assert samples_to([(10, 3.0), (20, 2.0), (30, 1.0)], 1.5) == pytest.approx(25.0)
    assert samples_to([(10, 0.5), (20, 0.4)], 1.0) == 10.0  # below it at the first report
    assert samples_to([(10, 3.0), (20, 2.0)], 1.0) is None


def test_the_curve_gives_back_a_known_critical_batch_size():
    trials = [
        t
        for b in (8, 16, 32, 64, 128)
        for t in (_trial(b, 1e-3, 1.3), _trial(b, 3e-3), _trial(b, 1e-2, 1.6))
    ]
    result = analyse(trials, target_loss=TARGET)
    assert result.critical_batch_curve == pytest.approx(B_CRIT, rel=0.02)
    assert result.steps_min == pytest.approx(S_MIN, rel=0.02)
    assert result.samples_min == pytest.approx(E_MIN, rel=0.02)
    # Each batch at its own best rate: 3e-3 reached the target first, whatever its final loss.
    row = {r.batch: r for r in result.rows}[32]
    assert row.samples_to_target == pytest.approx(E_MIN * (1 + 32 / B_CRIT), rel=0.01)
    assert row.steps_to_target == pytest.approx(row.samples_to_target / 32)


def test_an_adaptive_batch_is_drawn_beside_the_fixed_ones_and_kept_out_of_the_fit(tmp_path):
    """Trials of training.batch_schedule=adaptive: a row per batch they started at, their steps
    to the target counted through their batches; the curve's fit is the fixed batches' alone."""
    fixed = [_trial(b, lr, p) for b in (8, 16, 32, 64) for lr, p in ((1e-3, 1.3), (3e-3, 1.0))]
    alone = analyse(fixed, target_loss=TARGET)
    grown = ((0, 8), (1000, 16), (3000, 32))
    reach = 5000.0  # the target at 5,000 samples: 1,000 / 8 + 2,000 / 16 + 2,000 / 32 steps
    curve = [(s, TARGET * reach / s) for s in range(500, 10_001, 500)]
    adaptive = [
        BatchTrial(batch=32, lr=lr, final_loss=curve[-1][1] * k, curve=curve, phases=grown)
        for lr, k in ((3e-3, 1.0), (1e-2, 1.2))
    ]
    result = analyse([*fixed, *adaptive], target_loss=TARGET)
    assert [r.batch for r in result.rows] == [8, 16, 32, 64]
    assert result.critical_batch_curve == alone.critical_batch_curve  # the fit: fixed only
    (row,) = result.adaptive
    assert (row.batch, row.batches, row.best_lr) == (8, [8, 16, 32], 3e-3)
    assert row.samples_to_target == pytest.approx(reach)
    assert row.steps_to_target == pytest.approx(125 + 125 + 62.5)
    assert "| adaptive 8 -> 16 -> 32 | 0.003 |" in table(result)
    assert plot(result, tmp_path / "study.png").stat().st_size > 10_000


def test_wall_time_picks_the_batch_the_device_runs_fastest_to_the_target():
    # Throughput saturates at batch 32 on this "device": batch 32 wins though 8 needs fewer
    # samples and 64 fewer steps.
    speed = {8: 100.0, 16: 190.0, 32: 360.0, 64: 380.0}
    trials = [_trial(b, 3e-3, samples_per_sec=speed[b], noise_scale=20.0 + b) for b in speed]
    result = analyse(trials, target_loss=TARGET)
    assert result.fastest_batch == 32
    assert result.critical_batch_noise == pytest.approx((20 + 16 + 20 + 32) / 2)  # the median


def test_steps_halving_all_the_way_puts_the_critical_batch_above_the_batches_tried():
    trials = [
        BatchTrial(b, 1e-3, 0.5, [(s, 2.0 - s / 1000) for s in range(100, 2000, 100)])
        for b in (8, 16, 32)
    ]  # the same samples to the target at every batch: the steps halve with each doubling
    result = analyse(trials, target_loss=1.0)
    assert result.critical_batch_curve is None and "above" in result.curve_note


def test_without_a_target_three_batch_sizes_reach_it_before_their_end():
    lows = {8: 1.0, 16: 1.5, 32: 2.0, 64: 2.5}  # each batch's lowest loss before its end
    trials = [
        BatchTrial(b, 3e-3, low - 0.7, [(100, 3.0), (200, low), (300, low - 0.7)])
        for b, low in lows.items()
    ]
    result = analyse(trials)
    assert result.target_loss == 2.0
    # Batch 64 gets below 2.0 (to 1.8) only at its last report: not reached within its budget.
    reached = [r.samples_to_target for r in result.rows]
    assert reached == [150.0, pytest.approx(100 + 100 / 1.5), 200.0, None]


def test_the_noise_scale_is_read_where_the_target_was_reached():
    curve = [(s, 10.0 + s / 100) for s in range(0, 20_000, 100)]  # it grows as the loss falls
    trial = _trial(16, 3e-3, noise_curve=curve, noise_scale=99.0)
    result = analyse([trial, _trial(32, 3e-3)], target_loss=TARGET)
    reached = result.rows[0].samples_to_target
    assert result.rows[0].noise_scale == pytest.approx(10.0 + (reached // 100) / 1, abs=1.01)
    assert result.rows[0].noise_scale < 99.0


def test_the_plot_is_written(tmp_path):
    result = analyse([_trial(b, 3e-3) for b in (8, 16, 32, 64)], target_loss=TARGET)
    path = plot(result, tmp_path / "curve.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


@pytest.mark.e2e
@pytest.mark.slow
def test_the_batch_size_study_runs_and_answers(tmp_path):
    """`+sweeps=batch_size` as shipped, shrunk to a 2 x 2 grid of short runs."""
    sweep = tmp_path / "sweep"
    proc = procs.train(
        "-m",
        "+sweeps=batch_size",
        "model.n_layer=1",
        "model.n_embd=32",
        "model.n_head=2",
        "data.seq_len=32",
        "data.builtin_num_docs=300",
        "training.max_samples=256",
        "training.eval_every=1",
        "training.eval_samples=16",
        "hydra.sweeper.params={training.effective_batch_size:'choice(8,16)',"
        "training.lr:'choice(0.003,0.01)'}",
        f"hpo.storage={tmp_path / 'study.journal'}",
        f"hydra.sweep.dir={sweep}",
        f"data.cache_dir={tmp_path / 'cache'}",
        cwd=ROOT,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    study = results["batch_size_study"]
    assert results["trials"] == {"COMPLETE": 4}
    assert [r["batch"] for r in study["rows"]] == [8, 16]
    for row in study["rows"]:
        assert row["samples_to_target"] is not None and row["samples_per_sec"] > 0
        assert row["noise_scale"] is not None
    assert (sweep / "batch_size_study.png").stat().st_size > 10_000
    assert "Batch-size study" in proc.stdout + proc.stderr
    report = (sweep / "report.html").read_text()  # the curve is in the study's report too
    assert "<section id='batch_size_study' data-drawn=\"true\"><h2>Batch-size study</h2>" in report
    assert "<img alt='Batch-size study' src='data:image/png;base64,iVBOR" in report  # a PNG
    assert "<td>probed</td>" in report or "<td>cached</td>" in report  # each trial's batch plan


@pytest.mark.e2e
def test_the_batch_size_study_needs_a_sample_budget(tmp_path):
    proc = procs.train(
        "-m",
        "+sweeps=batch_size",
        "training.max_samples=null",
        "training.max_steps=10",
        f"hpo.storage={tmp_path / 'study.journal'}",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=ROOT,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: hpo.batch_size_study compares batches at equal samples, but the job has a budget "
        "in steps; set training.max_samples (and training.max_steps=null, "
        "training.max_tokens=null)"
    )
    assert not (tmp_path / "study.journal").exists()
