"""What makes short trials cheap: evaluation at its own, larger micro-batch without autograd, a
last evaluation that is the trial's result (never pruned), and data loaded once per process."""

from __future__ import annotations

import pytest
import torch

import app.components.data.memo as memo
from app.components.tasks.causal_lm import CausalLM
from app.config import DataConfig, load_config
from app.config.compose import compose
from app.core.outcomes import Pruned
from app.engine.records.summary import Summary
from app.engine.run import Observers
from app.engine.runner import run_training
from tests.conftest import AUTO_TINY

pytestmark = pytest.mark.integration


def tiny_cfg(cache, *overrides: str):
    return load_config(compose("train", [*AUTO_TINY, f"data.cache_dir={cache}", *overrides]))


@pytest.fixture
def eval_sizes(monkeypatch):
    """The micro-batch sizes evaluation ran, and whether autograd was recording anything."""
    seen: list[tuple[int, bool]] = []
    orig = CausalLM.eval_sums

    def eval_sums(self, model, inputs, targets):
        seen.append((len(inputs), torch.is_inference_mode_enabled()))
        return orig(self, model, inputs, targets)

    monkeypatch.setattr(CausalLM, "eval_sums", eval_sums)
    return seen


def test_auto_evaluates_at_four_times_the_micro_batch_with_the_same_loss(
    cache_dir, tmp_path, eval_sizes
):
    four = ["training.micro_batch_size=4", "training.eval_samples=32"]
    same = run_training(tiny_cfg(cache_dir, *four), tmp_path / "same")
    assert {size for size, _ in eval_sizes} == {4}
    eval_sizes.clear()
    auto = ["training.eval_micro_batch_size=auto"]
    larger = run_training(tiny_cfg(cache_dir, *four, *auto), tmp_path / "auto")
    assert {size for size, _ in eval_sizes} == {16} and larger.eval_micro_batch_size == 16
    assert all(inference for _, inference in eval_sizes)  # no autograd bookkeeping at all
    # The same validation tokens summed in larger chunks: the same loss.
    assert larger.final_val["loss"] == pytest.approx(same.final_val["loss"], rel=1e-6)
    assert larger.evaluations == 3 and larger.eval_time_s > 0  # steps 0, 3, 6


def test_an_int_sets_the_evaluation_micro_batch_and_is_capped_by_the_samples(
    cache_dir, tmp_path, eval_sizes
):
    run_training(
        tiny_cfg(cache_dir, "training.eval_micro_batch_size=100", "training.eval_samples=24"),
        tmp_path / "run",
    )
    assert {size for size, _ in eval_sizes} == {24}


def test_an_oom_at_the_larger_eval_micro_batch_shrinks_evaluation_only(
    cache_dir, tmp_path, eval_sizes
):
    faults = ["faults.oom_phase=eval", "faults.oom_above_micro_batch=8", "faults.oom_from_step=3"]
    summary = run_training(
        tiny_cfg(
            cache_dir,
            "training.micro_batch_size=4",
            "training.eval_micro_batch_size=auto",
            "training.eval_samples=32",
            *faults,
        ),
        tmp_path / "run",
    )
    # Training keeps its micro-batch; evaluation halves from 16 to 8, which fits.
    assert summary.status == "completed" and summary.micro_batch_size == 4
    assert summary.oom_count == 1
    assert [size for size, _ in eval_sizes][-4:] == [8, 8, 8, 8]
    ref = run_training(
        tiny_cfg(cache_dir, "training.micro_batch_size=4", "training.eval_samples=32"),
        tmp_path / "ref",
    )
    assert summary.final_val["loss"] == pytest.approx(ref.final_val["loss"], rel=1e-6)


class PruneAt:
    """A trial reporter whose pruner says 'prune' at the given steps."""

    def __init__(self, *steps: int) -> None:
        self.steps = set(steps)
        self.reported: list[int] = []

    def report(self, step: int, metrics: dict[str, float]) -> bool:
        self.reported.append(step)
        return step in self.steps

    def set_attrs(self, attrs) -> None:
        pass


def test_a_trial_is_never_pruned_at_its_last_evaluation(cache_dir, tmp_path):
    reporter = PruneAt(6)
    summary = run_training(tiny_cfg(cache_dir), tmp_path / "last", Observers(reporter=reporter))
    # The final value was reported and stands: the trial completed with it.
    assert reporter.reported == [0, 3, 6] and summary.status == "completed"
    assert summary.final_val["loss"] is not None


def test_a_trial_is_pruned_at_an_earlier_evaluation(cache_dir, tmp_path):
    with pytest.raises(Pruned):
        run_training(tiny_cfg(cache_dir), tmp_path / "early", Observers(reporter=PruneAt(3)))
    summary = Summary.read(tmp_path / "early")
    assert summary.status == "pruned" and summary.steps == 3


def test_the_data_is_loaded_once_per_process_while_its_config_stays(
    cache_dir, tmp_path, monkeypatch
):
    import app.components.data.lm.tokens as tokens

    memo.forget()
    loads: list[int] = []
    orig = tokens.load_token_data

    def counting(cfg):
        loads.append(cfg.seq_len)
        return orig(cfg)

    monkeypatch.setattr(tokens, "load_token_data", counting)
    for name, lr in (("a", "1e-3"), ("b", "3e-3")):  # two trials: only training settings differ
        run_training(tiny_cfg(cache_dir, f"training.lr={lr}"), tmp_path / name)
    assert loads == [32]
    run_training(tiny_cfg(cache_dir, "data.seq_len=24"), tmp_path / "c")  # another data config
    assert loads == [32, 24]
    memo.forget()


def test_the_data_memo_key_follows_the_files_and_needs_none_for_generated_data(tmp_path):
    import os

    from app.components.data.memo import data_key

    text = tmp_path / "a.txt"
    text.write_text("one document\n")
    files = DataConfig(source="text_files", paths=[str(text)])
    before = data_key("causal_lm", files)
    text.write_text("another, longer document\n")
    os.utime(text, ns=(1, 1))
    assert data_key("causal_lm", files) != before  # edited between two trials: read again
    generated = DataConfig(source="synthetic", paths=["/nowhere/*.txt"])
    assert data_key("causal_lm", generated)  # no files to look at, none looked for


class Recording:
    def __init__(self) -> None:
        self.heard: list[dict[str, float]] = []

    def report(self, step: int, metrics: dict[str, float]) -> bool:
        self.heard.append(dict(metrics))
        return False

    def set_attrs(self, attrs) -> None:
        pass


def test_an_evaluation_reports_each_metric_under_its_reported_name_alone(cache_dir, tmp_path):
    """The trial hears `val_<metric>` (Metric.reported), the one name hpo.report_metric is
    checked against, and no other spelling of it."""
    reporter = Recording()
    run_training(tiny_cfg(cache_dir), tmp_path / "run", Observers(reporter=reporter))
    assert reporter.heard and all(set(m) == {"val_loss"} for m in reporter.heard)
