"""What a run leaves in its directory: summary.json, metrics.jsonl, TensorBoard events."""

from __future__ import annotations

import json

import pytest

from app.engine.records.summary import Summary
from app.engine.runner import run_training
from tests.conftest import config, tiny

pytestmark = pytest.mark.integration

SUMMARY_KEYS = {
    "status",
    "steps",
    "final_train_loss",
    "final_val_loss",
    "micro_batch_size",
    "grad_accum_steps",
    "effective_batch_size",
    "device",
    "dtype",
    "tokens_per_sec",
    "peak_memory_bytes",
}
TRAIN_TAGS = {
    "train/loss",
    "train/learning_rate",
    "train/grad_norm",
    "train/step_time_s",
    "train/samples_per_sec",
    "train/tokens_per_sec",
}
VAL_TAGS = {"val/loss", "val/perplexity"}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("run")
    summary = run_training(config(tiny(tmp, "training.micro_batch_size=3")), tmp / "out")
    assert summary.status == "completed"
    return tmp / "out"


def test_summary_has_the_plan_and_the_results(run_dir):
    # The file's keys are the contract other tools read; the values through the typed record.
    assert json.loads((run_dir / "summary.json").read_text()).keys() >= SUMMARY_KEYS
    summary = Summary.read(run_dir)
    assert summary.steps == 6 and summary.device == "cpu" and summary.dtype == "fp32"
    assert summary.micro_batch_sizes == [3, 3, 2]  # effective 8 with micro 3: exact
    assert summary.grad_accum_steps == 3 and summary.effective_batch_size == 8
    assert summary.tokens_per_sec > 0 and summary.peak_memory_bytes > 0
    assert summary.final_val["loss"] < summary.initial_val["loss"]


def test_metrics_jsonl_has_one_line_per_logged_step(run_dir):
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_steps = [x["step"] for x in lines if "train/loss" in x]
    assert train_steps == [1, 2, 3, 4, 5, 6]
    assert [x["step"] for x in lines if "val/loss" in x] == [0, 3, 6]


def test_tensorboard_has_the_train_and_val_tags(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert tags >= TRAIN_TAGS | VAL_TAGS
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 2, 3, 4, 5, 6]


def test_checkpoint_written_at_the_end(run_dir):
    assert (run_dir / "checkpoints" / "step_00000006.pt").is_file()


def test_the_validation_set_does_not_depend_on_the_micro_batch(tmp_path):
    """Trials of a sweep differ in micro-batch (it is probed per shape and capped by the batch):
    their validation losses must be scored on the same sequences to be comparable."""
    initial = {}
    for micro in (2, 8):
        cfg = config(tiny(tmp_path, f"training.micro_batch_size={micro}", "training.max_steps=1"))
        initial[micro] = run_training(cfg, tmp_path / f"micro-{micro}").initial_val["loss"]
    # Same model and sequences, batched differently: equal up to float32 rounding.
    assert initial[2] == pytest.approx(initial[8], rel=1e-6)
