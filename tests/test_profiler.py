"""training.profiler: a torch.profiler window that writes a trace, kept out of the throughput."""

from __future__ import annotations

import json

import pytest

import app.engine.train.loop as loop
from app.config import ConfigError, load_config
from app.engine.runner import run_training
from tests.conftest import TINY, compose, config, tiny

pytestmark = pytest.mark.integration

# The meter reads a clock of the test's own: each step moves it by TICK, a profiled one by
# SLOW, and nothing else does. What is counted is then exact, whatever the machine's load.
TICK = 1.0
SLOW = 1000.0


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """Steps 2 and 3 (0-based) profiled and made slow; logs every 3 steps, so each log window
    holds one profiled step and two counted ones."""
    tmp = tmp_path_factory.mktemp("profiled")
    meters: list[loop.Throughput] = []
    real_step, real_meter = loop.step_with_recovery, loop.Throughput
    now = [0.0]

    def slow_when_profiled(run, batch, step):
        out = real_step(run, batch, step)
        now[0] += SLOW if 2 <= step < 4 else TICK
        return out

    def recording_meter(*args, **kwargs):
        meters.append(real_meter(*args, **kwargs, clock=lambda: now[0]))
        return meters[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loop, "step_with_recovery", slow_when_profiled)
        mp.setattr(loop, "Throughput", recording_meter)
        overrides = tiny(
            tmp,
            "training.profiler.steps=2",
            "training.profiler.start_step=2",
            "training.log_every=3",
        )
        summary = run_training(config(overrides), tmp / "run")
    assert summary.status == "completed"
    return tmp / "run", summary, meters[0]


def test_the_window_writes_a_trace_that_holds_the_steps(profiled):
    run_dir, summary, _ = profiled
    (trace,) = (run_dir / "tensorboard" / "profile").glob("rank0.*.pt.trace.json")
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("name", "").startswith("aten::") for e in events)
    assert summary.profile["steps"] == [2, 4]


def test_profiled_steps_are_kept_out_of_the_throughput(profiled):
    _, summary, meter = profiled
    tokens_per_step = 8 * 32  # effective batch x seq_len
    # Windows: steps 0-2 and 3-5, each with one profiled step: two counted steps' tokens each.
    assert [tokens for tokens, _ in meter.windows] == [2 * tokens_per_step] * 2
    assert [seconds for _, seconds in meter.windows] == [2 * TICK] * 2  # no profiled step
    # The steady figure is the second window's: two unprofiled steps of one TICK each.
    assert summary.tokens_per_sec == pytest.approx(tokens_per_step / TICK)


def test_the_logged_step_time_excludes_profiled_steps(profiled):
    run_dir, _, _ = profiled
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    logged = [x for x in lines if "train/loss" in x]
    assert [x["step"] for x in logged] == [3, 6]
    assert [x["train/step_time_s"] for x in logged] == [pytest.approx(TICK)] * 2


def test_a_window_of_profiled_steps_only_logs_its_loss_and_no_speed(tmp_path):
    overrides = tiny(tmp_path, "training.profiler.steps=1", "training.profiler.start_step=2")
    summary = run_training(config(overrides), tmp_path / "run")
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    by_step = {x["step"]: x for x in lines if "train/loss" in x}
    assert "train/tokens_per_sec" not in by_step[3]  # step 3 is the profiled step (index 2)
    assert all("train/tokens_per_sec" in by_step[s] for s in (1, 2, 4, 5, 6))
    assert summary.tokens_per_sec > 0


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("training.profiler.steps=-1", "training.profiler.steps=-1 must be an integer >= 0"),
        (
            "training.profiler.start_step=-2",
            "training.profiler.start_step=-2 must be an integer >= 0",
        ),
        (
            "training.profiler.start_step=6",
            r"training.profiler.start_step=6 is not a step of this run \(training.max_steps=6\)",
        ),
    ],
)
def test_profiler_settings_are_validated(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(compose([*TINY, "training.profiler.steps=2", override]))


def test_a_window_past_the_last_step_is_reported_as_the_steps_recorded(tmp_path):
    import torch
    from omegaconf import OmegaConf

    from app.engine.records.profiling import StepProfiler

    window = OmegaConf.create({"steps": 10, "start_step": 1})
    profiler = StepProfiler(window, tmp_path, torch.device("cpu"), max_steps=3)
    assert profiler.describe()["steps"] == [1, 3]  # steps 1 and 2: the run has no step 3
    assert [profiler.covers(s) for s in range(4)] == [False, True, True, False]


def test_a_run_resumed_inside_the_window_records_from_its_first_step(tmp_path):
    import torch
    from omegaconf import OmegaConf

    from app.engine.records.profiling import StepProfiler

    window = OmegaConf.create(
        {
            "steps": 4,
            "start_step": 2,
            "record_shapes": False,
            "profile_memory": False,
            "with_stack": False,
        }
    )
    profiler = StepProfiler(window, tmp_path, torch.device("cpu"), 10, resumed_at=4)
    assert profiler.describe()["steps"] == [4, 6]
    for step in range(4, 6):
        assert profiler.covers(step)
        profiler.before_step(step)
        torch.ones(4).sum()
        profiler.after_step(step)
    assert list((tmp_path / "tensorboard" / "profile").glob("rank0.*.pt.trace.json"))
