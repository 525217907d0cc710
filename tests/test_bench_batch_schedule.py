"""`python -m app.bench --batch-schedule`: the goals of the adaptive batch's issue read from the
runs, each run's curve read from its metrics.jsonl, and the table and plot drawn from them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from app.bench.studies.batch_schedule import (
    BATCHES,
    FRACTIONS,
    LRS,
    Arm,
    Grid,
    batch_schedule_table,
    curve,
    goals,
    plot_batch_schedule,
)
from app.bench.studies.paired_loss import PairedGap
from app.config.training import AdaptiveBatchConfig

pytestmark = pytest.mark.unit


def _run(schedule: str, batch: int, loss: float, steps: int, lr: float = 0.003) -> dict:
    return {
        "schedule": schedule, "batch": batch, "lr": lr, "final_loss": loss, "steps": steps,
        "fraction": None if schedule == "fixed" else 2.0, "lr_scaling": "none",
        "samples": 3840, "train_s": 2.0, "probe_samples_per_sec": None,
        "curve": [(steps // 2, 1920, loss * 2), (steps, 3840, loss)],
        "batches": None if schedule == "fixed" else [
            {"step": 0, "samples": 0, "batch": 8}, {"step": 200, "samples": 1600, "batch": 16}],
        "wall_s": 1.0,
    }  # fmt: skip


FIXED = [_run("fixed", 8, 0.42, 480), _run("fixed", 16, 0.50, 240), _run("fixed", 32, 0.9, 120),
         _run("fixed", 64, 1.6, 60)]  # fmt: skip


def test_the_goals_follow_the_issue():
    good = goals(FIXED, _run("adaptive", 8, 0.423, 320))  # 0.7 % above, 33 % fewer steps
    assert all(g["met"] for g in good.values()), good
    assert good["below_every_fixed_batch_with_as_few_steps"]["fixed_losses"] == {
        16: 0.50, 32: 0.9, 64: 1.6}  # fmt: skip
    close_but_slow = goals(FIXED, _run("adaptive", 8, 0.421, 400))  # 17 % fewer steps only
    assert not close_but_slow["at_least_30pct_fewer_steps_than_the_best_fixed"]["met"]
    quick_but_worse = goals(FIXED, _run("adaptive", 8, 0.43, 240))  # 2.4 % above
    assert not quick_but_worse["within_1pct_of_the_best_fixed_loss"]["met"]
    beaten = goals(FIXED, _run("adaptive", 8, 0.55, 240))  # batch 16 does better in as few steps
    assert not beaten["below_every_fixed_batch_with_as_few_steps"]["met"]


def test_every_grid_cell_runs_fixed_and_every_lr_adaptive_from_the_smallest_batch():
    runs = Grid().arms()
    assert len(runs) == len(BATCHES) * len(LRS) + len(FRACTIONS) * len(LRS)
    adaptive = {(a.batch, a.lr, a.fraction, a.lr_scaling) for a in runs if a.schedule == "adaptive"}
    assert adaptive == {(BATCHES[0], lr, f, "none") for lr in LRS for f in FRACTIONS}
    assert FRACTIONS[0] == AdaptiveBatchConfig().noise_fraction  # the shipped rule's first
    scaled = Grid(lrs=(0.003,), fractions=(2.0,), lr_scalings=("none", "sqrt")).arms()
    assert [a.rule for a in scaled if a.schedule == "adaptive"] == [
        "fraction 2", "fraction 2, lr sqrt"]  # fmt: skip


def test_the_grid_lr_is_the_rate_at_the_start_batch_whatever_the_scaling(monkeypatch, tmp_path):
    """training.lr is read at the reference batch (32 in the batch-size sweep): an adaptive run
    with lr_scaling=sqrt starting at batch 8 gets training.lr = 2 x the grid's rate."""
    from app.bench.studies import batch_schedule

    seen: list[list[str]] = []
    monkeypatch.setattr(batch_schedule, "train_run", lambda arm, o, where, core: seen.append(o))
    for scaling in ("none", "sqrt"):
        batch_schedule._runner(Arm("adaptive", 8, 0.003, 2.0, scaling), [], 32, str(tmp_path))(None)
    assert [[o for o in x if o.startswith("training.lr")] for x in seen] == [
        ["training.lr=0.003", "training.lr_scaling=none"],
        ["training.lr=0.006", "training.lr_scaling=sqrt"],
    ]
    # The micro-batch is set (the noise scale's small batch: the doublings depend on it), and
    # an extra override (the GPU step's auto) comes after it and wins
    assert all("training.micro_batch_size=4" in x for x in seen)
    batch_schedule._runner(
        Arm("fixed", 8, 0.003), ["training.micro_batch_size=auto"], 32, str(tmp_path)
    )(None)
    micro = [o for o in seen[-1] if o.startswith("training.micro_batch_size")]
    assert micro[-1] == "training.micro_batch_size=auto"


def test_a_curve_is_the_evaluations_of_a_run(tmp_path):
    path = tmp_path / "metrics.jsonl"
    records = [
        {"step": 5, "train/loss": 3.0},
        {"step": 20, "val/loss": 2.5, "data/samples_seen": 160.0},
        {"step": 40, "val/loss": 2.0, "data/samples_seen": 320.0},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert curve(path) == [(20, 160, 2.5), (40, 320, 2.0)]


def test_the_table_and_plot_show_each_batch_at_its_best_lr_and_the_adaptive_run(tmp_path):
    adaptive = _run("adaptive", 8, 0.423, 320)
    worse = _run("fixed", 8, 0.6, 480, lr=0.01)
    seed = {"seed": 0, "runs": [*FIXED, worse, adaptive], "best_fixed": FIXED[0],
            "best_adaptive": {"fraction 2": adaptive},
            "goals": {"fraction 2": goals(FIXED, adaptive)}}  # fmt: skip
    report = {"budget_samples": 3840, "cores": None, "seeds": [seed]}
    table = batch_schedule_table(report)
    assert "| 0 | fixed 8 | 8 | 0.003 | 0.4200 | 480 | 2.0 | - | 8 |" in table
    assert (
        "| 0 | adaptive, fraction 2 | 8 | 0.003 | 0.4230 | 320 | 2.0 | - | 8@0 -> 16@1600 |"
        in table
    )
    assert "| 0 | fraction 2 | at_least_30pct_fewer_steps_than_the_best_fixed | True |" in table
    plot_batch_schedule(report, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_loss_goal_is_shown_with_its_paired_standard_error():
    adaptive = _run("adaptive", 8, 0.423, 320)
    gap = PairedGap(relative=0.00714, stderr=0.0066, samples=128)
    seed = {"seed": 0, "runs": [*FIXED, adaptive], "best_fixed": FIXED[0],
            "best_adaptive": {"fraction 2": adaptive},
            "goals": {"fraction 2": goals(FIXED, adaptive, gap)}}  # fmt: skip
    table = batch_schedule_table({"budget_samples": 3840, "cores": None, "seeds": [seed]})
    assert (
        "| 0 | fraction 2 | within_1pct_of_the_best_fixed_loss | True | +0.71 % "
        "(paired s.e. 0.66 %) |" in table
    )
    assert "| at_least_30pct_fewer_steps_than_the_best_fixed | True | 33.3 % fewer |" in table


def test_the_paired_standard_error_is_that_of_the_per_sample_differences(monkeypatch):
    """Two runs on the same samples: the gap's error is the spread of their differences, not
    of their losses (which share each sample's difficulty)."""
    from app.bench.studies import paired_loss

    hard = torch.tensor([0.1, 0.5, 0.2, 0.9, 0.3, 0.7])  # samples of very different difficulty
    shift = torch.tensor([0.01, 0.03, 0.02, 0.02, 0.01, 0.03])
    losses = {
        "ours": paired_loss.SampleLosses(float((hard + shift).mean()), hard + shift),
        "ref": paired_loss.SampleLosses(float(hard.mean()), hard),
    }
    monkeypatch.setattr(paired_loss.SampleLosses, "of", lambda run: losses[str(run)])
    gap = paired_loss.paired_gap(Path("ours"), Path("ref"))
    ref = float(hard.mean())
    assert gap.relative == pytest.approx(float(shift.mean()) / ref, rel=1e-5)
    assert gap.stderr == pytest.approx(float(shift.std()) / 6**0.5 / ref, rel=1e-5)
    assert gap.stderr < float(hard.std()) / 6**0.5 / ref / 10  # far below either loss's own
    assert gap.samples == 6
    losses["short"] = paired_loss.SampleLosses(0.2, hard[:5])
    with pytest.raises(ValueError, match="different validation sets"):
        paired_loss.paired_gap(Path("short"), Path("ref"))


@pytest.mark.e2e
def test_the_bench_runs_the_grid_and_an_adaptive_run_that_grows(tmp_path):
    """`--batch-schedule` end to end on a tiny model, one LR and a rule that doubles at once:
    every fixed batch and the adaptive run, side by side on two cores, read back."""
    from tests import procs
    from tests.conftest import TINY

    tiny = [a for a in TINY if not a.startswith(("training.max_steps", "training.effective"))]
    out = tmp_path / "schedule.json"
    procs.run(
        [procs.PY, "-m", "app.bench", "--batch-schedule", "--seeds", "0", "--lrs", "0.003",
         "--fractions", "1e-6", "--cores", "0,1", "--json", out, *tiny,
         "training.max_samples=192", "training.adaptive_batch.patience_steps=1",
         f"data.cache_dir={tmp_path / 'cache'}"],
        timeout=400, check=True,
    )  # fmt: skip
    report = json.loads(out.read_text())
    (seed,) = report["seeds"]
    assert [(r["schedule"], r["batch"]) for r in seed["runs"]] == [
        ("fixed", 8), ("fixed", 16), ("fixed", 32), ("fixed", 64), ("adaptive", 8)]  # fmt: skip
    assert all(r["samples"] >= 192 and r["curve"] for r in seed["runs"])
    grown = seed["best_adaptive"]["fraction 1e-06"]
    assert [p["batch"] for p in grown["batches"]][:2] == [8, 16]
    assert grown["steps"] < seed["runs"][0]["steps"]  # fewer steps than batch 8 throughout
    # The loss goal beside its paired error: both final models re-evaluated, the same loss
    loss_goal = seed["goals"]["fraction 1e-06"]["within_1pct_of_the_best_fixed_loss"]
    assert 0 < loss_goal["paired_stderr"] < 0.5 and loss_goal["paired_samples"] > 1
    assert out.with_suffix(".png").stat().st_size > 10_000


def test_a_bad_lr_or_fraction_is_one_line_before_any_run(capsys):
    from app.bench.__main__ import parse_args

    assert parse_args(["--batch-schedule", "--lrs", "0.003,0.005"]).lrs == (0.003, 0.005)
    assert parse_args(["--batch-schedule", "--lr-scalings", "none,sqrt"]).lr_scalings == (
        "none", "sqrt")  # fmt: skip
    for bad in (["--lrs", "x"], ["--fractions", "0"], ["--lr-scalings", "cubic"]):
        with pytest.raises(SystemExit) as e:
            parse_args(["--batch-schedule", *bad])
        assert e.value.code == 2
        assert f"argument {bad[0]}: invalid" in capsys.readouterr().err.splitlines()[-1]
