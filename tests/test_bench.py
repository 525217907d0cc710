from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from app.bench.throughput import profiles, schedule, workers
from app.bench.throughput.clock import StepClock
from app.bench.throughput.report import add_ratios, aggregate, benchmark_table

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent


def fake_run(tps: float, mem: int, **extra) -> dict:
    return {
        "tokens_per_sec": tps,
        "samples_per_sec": tps / 128,
        "peak_memory_bytes": mem,
        "peak_memory_kind": "peak_rss",
        "first_step_s": 5.0,
        "final_loss": 3.0,
        "mfu": None,
        "device_name": "cpu",
        "dtype": "fp32",
        "tokens_per_step": 4096,
        **extra,
    }


def test_aggregate_takes_medians_and_skips_failures() -> None:
    runs = [fake_run(100, 10), fake_run(300, 30), fake_run(200, 20), {"error": "exit 1: boom"}]
    agg = aggregate(runs)
    assert agg["runs_ok"] == 3
    assert agg["tokens_per_sec"] == 200
    assert (agg["tokens_per_sec_min"], agg["tokens_per_sec_max"]) == (100, 300)
    assert agg["peak_memory_bytes"] == 20
    assert aggregate([{"error": "x"}]) == {"runs_ok": 0, "errors": ["x"]}


def test_ratios_are_relative_to_the_bare_loop_of_the_same_variant() -> None:
    rows = [
        {"variant": "eager", "contender": c, **aggregate([fake_run(t, m)])}
        for c, t, m in (("trainer", 98, 105), ("bare", 100, 100), ("hf", 80, 120))
    ]
    add_ratios(rows, key=lambda r: r["variant"], baseline=lambda r: r["contender"] == "bare")
    ratios = {r["contender"]: (r["paired_speed_ratio"], r["memory_ratio"]) for r in rows}
    assert ratios == {
        "trainer": pytest.approx((0.98, 1.05)),
        "bare": (1.0, 1.0),
        "hf": pytest.approx((0.8, 1.2)),
    }


def test_table_renders_rows_and_failures() -> None:
    rows = [
        {"variant": "eager", "contender": "bare", **aggregate([fake_run(100, 2**20)])},
        {"variant": "eager", "contender": "hf", **aggregate([{"error": "exit 1: no"}])},
    ]
    add_ratios(rows, key=lambda r: r["variant"], baseline=lambda r: r["contender"] == "bare")
    report = {
        "profile": "tiny",
        "rounds": 1,
        "warmup_steps": 1,
        "measured_steps": 2,
        "rows": rows,
        "machine": {"cpu": "x", "cpus": 2, "torch": "t", "transformers": "tf", "python": "3"},
    }
    table = benchmark_table(report)
    bare_row = "| eager | bare | 100 | 100-100 | 1.000 | 1.000 | 1 | 1.000 | 5.0 | n/a | 3.000 |"
    assert bare_row in table
    assert "| eager | hf | failed: exit 1: no |" in table


def test_ablations_start_with_the_current_default() -> None:
    for profile in ("tiny", "gpt2_small"):
        for name, arms in profiles.ablations(profile).items():
            assert len(arms) >= 2, name
            assert all(a.contender in profiles.CONTENDERS for a in arms)
            assert len({a.label for a in arms}) == len(arms)


def test_unknown_selection_is_one_line() -> None:
    with pytest.raises(SystemExit, match="unknown: nope; choose from"):
        schedule._pick({"a": 1}, "a,nope")


def test_step_clock_times_warmup_to_end_on_cpu() -> None:
    clock = StepClock(0.0, warmup=2, total=4, device=torch.device("cpu"))
    for _ in range(4):
        clock.step_done()
    assert clock.first_step_s > 0
    assert clock.t_end >= clock.t_warm
    peak, kind = clock.peak
    assert kind == "peak_rss" and peak > 0


def spec(tmp_path: Path, contender: str) -> dict:
    return {
        "contender": contender,
        "overrides": [*profiles.PROFILES["smoke"]["overrides"], "training.progress_bar=false"],
        "options": {},
        "warmup": 1,
        "steps": 2,
        "tmp": str(tmp_path),
        "out": str(tmp_path / "result.json"),
        "start_time": time.time(),
    }


@pytest.mark.parametrize("contender", ["trainer", "bare"])
def test_worker_in_process(tmp_path: Path, monkeypatch, contender: str) -> None:
    monkeypatch.setenv("HYDRATRAIN_CACHE", str(tmp_path / "cache"))
    import app.engine.train.loop

    original = app.engine.train.loop.step_with_recovery
    result = {"trainer": workers.work_trainer, "bare": workers.work_bare}[contender](
        spec(tmp_path, contender)
    )
    assert app.engine.train.loop.step_with_recovery is original  # the timing hook is removed again
    assert result["tokens_per_sec"] > 0
    assert result["tokens_per_step"] == 4 * 32
    assert result["mfu"] is None  # CPU
    assert result["peak_memory_kind"] == "peak_rss"


def _bench_cli(tmp_path: Path, profile: str) -> tuple[subprocess.CompletedProcess, dict, dict]:
    """`python -m app.bench --profile PROFILE --rounds 1`: the process, the report, its rows."""
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "app.bench",
            "--profile",
            profile,
            "--rounds",
            "1",
            "--json",
            str(out),
        ],
        cwd=ROOT,
        env={**os.environ, "HYDRATRAIN_CACHE": str(tmp_path / "cache")},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    rows = {r["contender"]: r for r in report["rows"]}
    assert set(rows) == {"trainer", "bare", "hf"}
    assert all(r["runs_ok"] == 1 for r in rows.values()), report["runs"]
    return proc, report, rows


@pytest.mark.e2e
@pytest.mark.slow
def test_bench_command_end_to_end(tmp_path: Path) -> None:
    proc, report, rows = _bench_cli(tmp_path, "smoke")
    assert "| eager | trainer |" in proc.stdout and "| eager | hf |" in proc.stdout
    assert rows["bare"]["speed_ratio"] == 1.0
    assert report["machine"]["torch"]


def test_classification_rows_report_samples_per_second() -> None:
    runs = [fake_run(3000, 2**20, unit="samples", samples_per_sec=s) for s in (90, 110, 100)]
    rows = [
        {"variant": "eager", "contender": "bare", **aggregate(runs)},
        {"variant": "eager", "contender": "trainer", **aggregate(runs[::-1])},
    ]
    add_ratios(rows, key=lambda r: r["variant"], baseline=lambda r: r["contender"] == "bare")
    assert rows[0]["samples_per_sec"] == 100
    assert (rows[0]["samples_per_sec_min"], rows[0]["samples_per_sec_max"]) == (90, 110)
    assert rows[1]["by_round"] == [100, 110, 90]
    assert rows[1]["speed_ratio"] == 1.0
    report = {
        "profile": "smoke_nli",
        "rounds": 3,
        "warmup_steps": 1,
        "measured_steps": 2,
        "rows": rows,
        "machine": {"cpu": "x", "cpus": 2, "torch": "t", "transformers": "tf", "python": "3"},
    }
    table = benchmark_table(report)
    assert "| samples/s (median) |" in table and "| padding |" in table
    assert "| eager | bare | 100 | 90-110 | 1.000 | 1.000 | 1 | 1.000 | 3,000 |" in table


def nli_spec(tmp_path: Path, contender: str) -> dict:
    overrides = [*profiles.PROFILES["smoke_nli"]["overrides"], "training.progress_bar=false"]
    overrides.append(f"data.cache_dir={tmp_path / 'cache'}")
    return {**spec(tmp_path, contender), "overrides": overrides}


@pytest.mark.parametrize("contender", ["trainer", "bare", "hf"])
def test_classification_worker_in_process(tmp_path: Path, contender: str) -> None:
    """The three contenders on the tiny NLI task: the same samples per step, samples/s."""
    worker = {"trainer": workers.work_trainer, "bare": workers.work_bare, "hf": workers.work_hf}
    result = worker[contender](nli_spec(tmp_path, contender))
    assert result["unit"] == "samples"
    assert result["samples_per_step"] == 8
    assert result["samples_per_sec"] > 0 and result["tokens_per_sec"] > 0
    assert 0 <= result["padding"] < 0.5  # length-grouped, padded per micro-batch
    assert math.isfinite(result["final_loss"])


@pytest.mark.e2e
@pytest.mark.slow
def test_bench_command_classification_end_to_end(tmp_path: Path) -> None:
    proc, _, rows = _bench_cli(tmp_path, "smoke_nli")
    assert "samples/s (median)" in proc.stdout and "| eager | hf |" in proc.stdout
    for r in rows.values():
        assert r["unit"] == "samples" and r["samples_per_step"] == 8
        assert r["samples_per_sec"] > 0 and math.isfinite(r["final_loss"])
    assert rows["bare"]["speed_ratio"] == 1.0


def test_rounds_rotate_so_every_arm_runs_in_every_slot(monkeypatch):
    import argparse

    seen: list[str] = []

    def fake_worker(arm, *args):
        seen.append(arm.label)
        return {"error": "not run"}

    monkeypatch.setattr(schedule, "run_worker", fake_worker)
    arms = {(("v", c)): profiles.Arm(c, c) for c in ("trainer", "bare", "hf")}
    schedule.run_rounds(
        argparse.Namespace(rounds=3, warmup=1, steps=1), {"warmup": 1, "steps": 1}, arms
    )
    slots = [seen[i::3] for i in range(3)]  # who ran first, second, third in each round
    assert all(sorted(slot) == ["bare", "hf", "trainer"] for slot in slots)


def test_the_fleet_table_gives_ratios_to_one_worker_and_medians_over_rounds() -> None:
    from app.bench.studies.fleet import fleet_table, summarize, with_ratios

    def run(workers: int, wall: float, span: float) -> dict:
        by = {"lone": 16} if workers == 1 else {"0": 8, "1": 8}
        return {"workers": workers, "trials": 16, "wall_s": wall, "span_s": span,
                "start_s": (wall - span) / 2, "end_s": (wall - span) / 2,
                "median_trial_s": 1.0, "trials_by_worker": by}  # fmt: skip

    one = summarize([run(1, 200, 190), run(1, 100, 90), run(1, 120, 110)])
    two = summarize([run(2, 60, 55), run(2, 70, 60), run(2, 64, 58)])
    arms = with_ratios({1: one, 2: two})
    assert arms[1]["wall_s"] == 120 and arms[2]["span_s"] == 58  # medians
    assert math.isclose(arms[2]["ratio_wall"], 120 / 64)
    table = fleet_table({"arms": arms, "rounds": 3})
    assert "| 2 | 16 | 64.0 | 900 | 1.88x |" in table and "0: 8, 1: 8" in table
    assert "| 1.00 | 3.0 | 3.0 | 0: 8, 1: 8 |" in table  # start-up and ending: medians


def test_the_fleet_bench_counts_trials_by_worker_and_the_lone_worker_as_lone() -> None:
    from optuna.trial import create_trial

    from app.bench.studies.fleet import _by_worker

    def trial(worker: int | None):
        return create_trial(value=1.0, user_attrs={"worker": worker})

    assert _by_worker([trial(None), trial(None)]) == {"lone": 2}  # it records worker: None
    assert _by_worker([trial(0), trial(1), trial(0)]) == {"0": 2, "1": 1}


@pytest.mark.e2e
@pytest.mark.slow
def test_report_bench_times_the_command_and_a_warm_process_against_its_imports() -> None:
    from app.bench.studies.study_report import report_bench_table, run_report_bench

    report = run_report_bench(rounds=1, trials=30)
    assert report["trials"] == 30 and report["report_bytes"] > 1_000_000  # plotly inlined
    for key in ("whole_command_s", "in_process_s", "imports_baseline_s"):
        assert len(report[key]) == 1 and report[key][0] > 0
    table = report_bench_table(report)
    assert table.count("\n| ") == 3 and "30 trials, 1 rounds" in table


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["--budget-only"], "budget_only"),
        (["--hpo", "--reuse-unpruned"], "reuse_unpruned"),
        (["--mf-peers", "--pairs", "mup"], "pairs"),
        (["--seeds", "2"], "seeds"),
        (["--benchmarks", "mfh3_good"], "benchmarks"),
        (["--only", "compile"], "only"),
    ],
)
def test_an_option_no_chosen_bench_reads_is_one_line_naming_its_readers(capsys, argv, option):
    """Ignored, `--budget-only` without `--default-study` would run the throughput bench for
    however long it takes, and the option asked for would never have been heard."""
    from app.bench.__main__ import READERS, parse_args

    with pytest.raises(SystemExit) as exited:
        parse_args(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    readers = " or ".join(f"--{kind}" for kind in READERS[option])
    assert err.count("\n") == 1 and f"error: --{option.replace('_', '-')}" in err, err
    assert readers in err, err
    for kind in READERS[option]:  # with any one of its readers, the option is taken
        parse_args([*argv, f"--{kind}"])


def test_every_reader_named_is_a_bench_and_every_option_one_of_ours() -> None:
    from app.bench.__main__ import KINDS, READERS, parse_args

    args = vars(parse_args([]))
    assert set(READERS) <= set(args)
    assert {kind for kinds in READERS.values() for kind in kinds} <= set(KINDS)
