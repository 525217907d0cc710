"""`python -m app.bench --parallel`'s arithmetic, on made-up runs: the agreement's cost is the
same arm's step time with it minus without it, per agreement a step runs."""

from __future__ import annotations

import pytest

from app.bench.throughput import parallel

pytestmark = pytest.mark.unit

SPEED = {  # tokens/s by (parallelism, agreement)
    ("one", True): 1000.0,
    ("ddp", True): 900.0,
    ("ddp", False): 1000.0,
    ("fsdp", True): 400.0,
    ("fsdp", False): 500.0,
}


def fake_run(ranks, args, run_dir, tmp):
    kind = next((a.split("=")[1] for a in args if a.startswith("training.parallelism=")), "one")
    speed = SPEED[(kind, parallel.NO_AGREEMENT not in args)]
    state = {"total": 100 if kind == "fsdp" else 200}
    return {
        "tokens_per_sec": speed,
        "tokens_per_step": 4096,
        "model_state_bytes": state,
        "peak_memory_bytes_per_rank": [2**20] * ranks,
        "world_size": ranks,
    }


def test_the_agreement_costs_the_step_time_it_adds_per_agreement(monkeypatch):
    monkeypatch.setattr(parallel, "run_arm", fake_run)
    report = parallel.run_parallel_bench([], rounds=1)
    ddp = report["arms"]["ddp, agreement"]
    assert ddp["agreements_per_step"] == 2 * (32 // (2 * 2)) + 2 == 18
    assert ddp["agreement_us"] == pytest.approx((4096 / 900 - 4096 / 1000) / 18 * 1e6)
    assert ddp["ratio_to_no_agreement"] == pytest.approx(0.9)
    assert report["arms"]["ddp, no agreement"]["agreements_per_step"] == 0
    table = parallel.parallel_table(report)
    assert "| fsdp, agreement | 2 | 400 | 10.240 | 0.800x | 18 |" in table
