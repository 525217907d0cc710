"""`python -m app.bench --probe-share`: the arms of each round, the table's medians and the
probed compiled run paired with the same run set by hand (no run started: `_train` answered)."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from app.bench.throughput import probe_share
from app.bench.throughput.probe_share import ARMS, ShareRun, probe_share_table

pytestmark = pytest.mark.unit


def share_run(arm: str, micro: int, process_s: float, probe_s: float | None = 2.0) -> ShareRun:
    compiled = arm != ARMS[0]
    return ShareRun(
        arm=arm, micro_batch_size=micro, chosen_by="throughput", probe_seconds=probe_s,
        confirm_seconds=10.0 if compiled and probe_s else None,
        probe_graphs=2 if compiled and probe_s else None, run_graphs=2 if compiled else None,
        wall_s=process_s - 5.0, process_s=process_s, status="completed",
    )  # fmt: skip


def test_each_round_runs_the_arms_and_sets_the_compiled_runs_choice_by_hand(monkeypatch):
    calls: list[tuple[str, list[str]]] = []

    def answer(work, name, arm, overrides, env, cwd) -> ShareRun:
        calls.append((name, overrides))
        return share_run(arm, 16 if name.endswith("-c") else 32, 50.0)

    monkeypatch.setattr(probe_share, "_train", answer)
    report = probe_share.run_probe_share_bench(["model.n_layer=1"], rounds=2)
    assert [name for name, _ in calls] == ["cold", "0-e", "0-c", "0-f", "1-e", "1-c", "1-f"]
    by_name = dict(calls)
    assert "model.compile=false" in by_name["0-e"] and "model.compile=true" in by_name["0-c"]
    assert by_name["1-f"][-2:] == ["model.compile=true", "training.micro_batch_size=16"]
    assert len(report["runs"]) == 7 and report["rounds"] == 2


def test_the_table_takes_medians_per_arm_and_pairs_the_compiled_runs_by_round():
    runs = [share_run(ARMS[1], 32, 100.0)]  # cold
    for probed_s, fixed_s in ((60.0, 50.0), (70.0, 62.0), (90.0, 60.0)):
        runs += [share_run(ARMS[0], 32, 40.0), share_run(ARMS[1], 32, probed_s)]
        runs.append(share_run(ARMS[2], 32, fixed_s, probe_s=None))
    report = {"steps": 100, "rounds": 3, "load_before_after": [[1.0], [2.0]]}
    table = probe_share_table({**report, "runs": [asdict(r) for r in runs]})
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("|")}
    assert rows["cold"].split("|")[5].strip() == "2 / 2"
    assert rows["compiled, probed"].split("|")[2].strip() == "32,32,32"
    assert rows["compiled, probed"].split("|")[6].strip() == "65.0"  # median run wall
    assert rows["compiled, set by hand"].split("|")[5].strip() == "- / 2"
    # Paired: 10, 8 and 30 s more; the median 10 s of its 60 s process wall.
    assert "10.0 s more (0.167 of its process wall), median of 3 paired rounds" in table
