"""The arithmetic of `python -m app.bench --batch-budget`: its goals and its table, on made-up
figures (the bench itself runs for half an hour)."""

from __future__ import annotations

import pytest

from app.bench.studies.batch_budget import batch_budget_table, goals

pytestmark = pytest.mark.unit


def _seed(samples_gap: float, sqrt_gap: float, curve: float | None, noise: float | None):
    study = {
        "pick": {"training.effective_batch_size": 8, "training.lr": 0.004},
        "pick_at_budget": 0.5,
        "device_seconds": 100.0,
        "optimizer_steps": 1000,
    }
    return {
        "grid": {
            "best_params": {"training.effective_batch_size": 8, "training.lr": 0.003},
            "best_value": 0.5,
            "device_seconds": 300.0,
            "critical_batch_curve": curve,
            "curve_note": "below the batches tried",
            "critical_batch_noise": noise,
            "target_loss": 1.4,
        },
        "studies": {
            "steps": {**study, "vs_grid": 2.0},
            "samples": {**study, "vs_grid": samples_gap},
            "samples+sqrt": {**study, "vs_grid": sqrt_gap},
        },
    }


def test_goals_are_met_within_one_percent_and_a_factor_of_two():
    runs = {"0": _seed(0.004, 0.2, 5.5, 4.6), "1": _seed(-0.01, 0.02, 6.0, 11.0)}
    g = goals(runs)
    assert g["samples_within_1pct"]["met"] is True
    assert g["samples+sqrt_within_1pct"]["met"] is False  # 20 % on seed 0
    assert g["noise_scale_within_2x_of_curve"]["met"] is True  # 0.84 and 1.83


def test_a_noise_scale_off_by_more_than_two_or_a_missing_curve_is_missed():
    assert not goals({"0": _seed(0, 0, 5.0, 10.5)})["noise_scale_within_2x_of_curve"]["met"]
    assert not goals({"0": _seed(0, 0, None, 4.0)})["noise_scale_within_2x_of_curve"]["met"]


def test_the_table_names_each_study_and_its_gap():
    report = {"budget_samples": 3840, "seeds": {"0": _seed(0.004, 0.2, None, 4.6)}}
    report["goals"] = goals(report["seeds"])
    table = batch_budget_table(report)
    assert "| 0 | samples | 8, 0.004 | 0.5000 | +0.4 % |" in table
    assert "| 0 | steps | 8, 0.004 | 0.5000 | +200.0 % |" in table
    assert "critical batch from the curve below the batches tried" in table
    assert "goal samples_within_1pct: met" in table
