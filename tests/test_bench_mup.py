"""The μP transfer bench's arithmetic (app/bench/mup/transfer.py) on made-up studies: where each
grid's best rate lies, how far it moves from width 64's, whether the proxy's pick is within 1 %
of the wide grid's best, and what the proxy study costs against the default study at 512."""

from __future__ import annotations

import pytest

from app.bench.mup.transfer import LRS, WIDTHS, GridRow, goals, mean_curves, transfer_table

pytestmark = pytest.mark.unit


def _grid(p: str, width: int, seed: int, best: float, seconds: float = 1.0) -> GridRow:
    losses = {str(lr): 2.0 + abs(LRS.index(lr) - LRS.index(best)) * 0.1 for lr in LRS}
    losses[str(LRS[-1])] = None  # the largest rate diverged
    return {"width": width, "parametrization": p, "seed": seed, "losses": losses,
            "device_seconds": [seconds] * len(LRS), "cpu_s": seconds * len(LRS),
            "best_lr": best}  # fmt: skip


def _report(standard_best: dict[int, float], pick: float, study_s: float):
    grids = [
        _grid(p, w, seed, standard_best[w] if p == "standard" else 4e-3, seconds=10.0)
        for p in ("standard", "mup") for w in WIDTHS for seed in (0, 1)
    ]  # fmt: skip
    study = {"trials": [{"device_seconds": study_s}], "states": {"COMPLETE": 1}, "best_value": 2.0,
             "cpu_s": study_s + 10.0}  # fmt: skip
    proxy = [{"seed": s, "study": study, "target_value": pick, "target_device_seconds": 10.0,
              "command": "python -m app.train"} for s in (0, 1)]  # fmt: skip
    return grids, proxy


def test_the_best_rate_moves_in_grid_steps_and_mup_holds_it():
    grids, proxy = _report({64: 4e-3, 128: 2e-3, 256: 1e-3, 512: 5e-4}, 2.0, 20.0)
    g = goals(grids, proxy, LRS)
    assert g["a_best_lr_within_one_step_of_width_64_mup"]["met"]
    standard = g["a_best_lr_within_one_step_of_width_64_standard"]
    assert not standard["met"]
    assert standard["steps"]["seed 0"] == {512: -3, 256: -2, 128: -1, 64: 0}


def test_the_pick_is_judged_against_the_wide_grids_best_and_the_cost_against_20_trials():
    grids, proxy = _report({w: 4e-3 for w in WIDTHS}, 2.0 * 1.009, 20.0)
    g = goals(grids, proxy, LRS)
    assert g["b_the_pick_within_1pct_at_512"]["met"]  # 0.9 % above the best (2.0)
    cost = g["c_at_most_a_fifth_of_the_default_study_at_512"]
    assert cost["default_study_at_512_s"] == 200.0  # 20 trials' worth at 10 s each
    assert cost["ratio"] == pytest.approx(30.0 / 200.0) and cost["met"]
    assert cost["cpu_ratio"] == pytest.approx(30.0 / 200.0)
    grids, proxy = _report({w: 4e-3 for w in WIDTHS}, 2.0 * 1.011, 40.0)
    g = goals(grids, proxy, LRS)
    assert not g["b_the_pick_within_1pct_at_512"]["met"]
    assert not g["c_at_most_a_fifth_of_the_default_study_at_512"]["met"]  # 50 s > 40 s


def test_the_curves_average_the_seeds_and_leave_out_a_rate_that_diverged():
    grids, proxy = _report({w: 4e-3 for w in WIDTHS}, 2.0, 20.0)
    report = {"widths": WIDTHS, "lrs": list(LRS), "samples": 3200, "seq_len": 64, "cores": None,
              "grids": grids, "proxy": proxy, "standard_proxy": proxy[:1],
              "goals": goals(grids, proxy, LRS)}  # fmt: skip
    curves = mean_curves(report)
    assert [lr for lr, _ in curves["mup"][512]] == list(LRS[:-1])
    assert min(curves["mup"][512], key=lambda pt: pt[1]) == (4e-3, 2.0)
    table = transfer_table(report)
    assert "| mup | 512 | 1 |" in table and "**2.0000**" in table and "goal b_" in table
    assert "under the standard parametrization, its pick at width 512 (seed 0): 2.0" in table


def test_reuse_takes_the_studies_an_earlier_log_holds_and_runs_no_study_again(monkeypatch):
    from app.bench.mup import transfer

    log = "\n".join([
        'standard width 512 seed 0: {"best_value": 0.7, "trials": []}',
        'mup width 64 seed 1: {"best_value": 1.9, "trials": []}',
        'standard proxy: {"best_value": 1.16, "trials": []}',
        'proxy: {"best_value": 1.14, "trials": []}',
        "a line of progress",
    ])  # fmt: skip
    earlier = transfer.earlier_transfer_studies(log)
    assert set(earlier) == {"standard width 512 seed 0", "mup width 64 seed 1", "standard proxy"}
    assert earlier["mup width 64 seed 1"] == {"best_value": 1.9, "trials": []}

    def ran(*_: object, **__: object) -> None:
        raise AssertionError("a study was run")

    monkeypatch.setattr(transfer, "run_study", ran)
    for arm in (transfer.Arm(512, "standard", 0), transfer.Arm(64, "mup", 1)):
        assert transfer._grid_task(arm, LRS, [], earlier).run(None) == earlier[arm.name]
    with pytest.raises(AssertionError, match="was run"):  # a grid the log does not hold
        transfer._grid_task(transfer.Arm(512, "mup", 0), LRS, [], earlier).run(None)
    with pytest.raises(AssertionError, match="was run"):  # the μP proxy study: always run
        transfer._proxy([], [0, 1], None)


def test_a_reuse_log_that_cannot_be_read_is_refused_before_any_study(capsys, tmp_path):
    from app.bench.__main__ import parse_args

    with pytest.raises(SystemExit) as done:
        parse_args(["--mup-transfer", "--reuse", str(tmp_path / "missing.log")])
    assert done.value.code == 2
    assert "argument --reuse: cannot read" in capsys.readouterr().err
    log = tmp_path / "earlier.log"
    log.write_text("proxy: {}\n")
    assert parse_args(["--mup-transfer", "--reuse", str(log)]).reuse == "proxy: {}\n"
    assert parse_args(["--mup-transfer"]).reuse is None  # no log: nothing read
