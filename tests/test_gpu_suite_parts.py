"""The GPU suite in parts: each fits one device call of a 15-minute loan, the parts a loan
runs add to one report, across loans too (`--from`)."""

from __future__ import annotations

import pytest

from app.gpu_suite import cli, report
from app.gpu_suite.__main__ import pending, step_table
from app.gpu_suite.steps import PART_S, STEPS, parts
from app.gpu_suite.suite import Step

pytestmark = pytest.mark.unit

NEVER_MEASURED = {"bench", "scale"}  # on no card yet (docs/gpu-suite/h200.md, 2026-11-28)


def _step(number: int, limit_s: float) -> Step:
    return Step(number, f"s{number}", "a step", limit_s, lambda ctx: None)


def test_consecutive_steps_are_packed_into_parts_that_fit_one_call():
    steps = [_step(1, 300), _step(2, 240), _step(3, 100), _step(4, 500), _step(5, 30)]
    assert [[s.number for s in p] for p in parts(steps, budget_s=540)] == [[1, 2], [3], [4, 5]]


def test_every_part_of_the_suite_fits_one_call_and_the_unmeasured_steps_come_first():
    planned = parts(STEPS)
    assert [s for p in planned for s in p] == STEPS
    assert all(sum(s.limit_s for s in p) <= PART_S for p in planned)
    first_two = {s.name for p in planned[:2] for s in p}
    assert first_two >= NEVER_MEASURED | {"default_run", "probe"}  # and the probe under compile


def test_part_n_runs_that_part_and_the_list_shows_each_part(tmp_path):
    args = cli.parse(["--out", str(tmp_path), "--part", "2"], STEPS)
    assert args.selected == parts(STEPS)[1]
    table = step_table(STEPS)
    assert all(f"--part {n}" in table for n in range(1, len(parts(STEPS)) + 1))


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--part", "0"], "--part=0 is not a part; the parts are 1-"),
        (["--part", "1", "--only", "bench"], "--only and --part are alternatives"),
        (["--from", "missing.json"], "--from missing.json: not a report of the suite"),
    ],
)
def test_a_bad_part_or_earlier_report_is_one_line(argv, needle, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        cli.parse(["--out", str(tmp_path / "x"), *argv], STEPS)
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err


def test_an_earlier_loans_report_is_kept_and_pending_leaves_its_steps_out(tmp_path):
    earlier = report.Report(
        {"device": "NVIDIA H100 80GB HBM3"},
        [report.StepRecord(1, "bench", "t", status="passed"),
         report.StepRecord(2, "default_run", "t", status="passed")],
        [{"started": "loan 1", "command": "--part 1", "device": "H100"}],
    )  # fmt: skip
    report.write(tmp_path / "earlier", earlier, "")
    here = report.Report({"device": "NVIDIA H200"}, [report.StepRecord(2, "default_run", "t")])
    both = report.merged(report.load_file(tmp_path / "earlier" / "report.json"), here)
    assert [(s.name, s.status) for s in both.steps] == [
        ("bench", "passed"),
        ("default_run", "not_run"),
    ]
    assert both.parts == earlier.parts and both.header["device"] == "NVIDIA H200"
    assert [s.name for s in pending(STEPS, both)][:2] == ["default_run", "scale"]
