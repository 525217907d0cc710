"""Out-of-memory recovery in training and evaluation (app/engine/train/recovery.py), with injected
OOMs on CPU. The engine is watched through its seams: a recording task and step hooks."""

from __future__ import annotations

import json
import weakref
from pathlib import Path

import pytest
import torch

from app.config import load_config
from app.config.compose import compose
from app.core.outcomes import TrainingOOM
from app.engine.records.summary import Summary
from app.engine.run import Observers, StepHooks
from app.engine.runner import run_training
from tests.conftest import AUTO_TINY
from tests.fakes import Attempts, MicroBatchFrom, RecordingLM

pytestmark = pytest.mark.integration


def tiny_cfg(cache: Path, *overrides: str):
    return load_config(compose("train", [*AUTO_TINY, f"data.cache_dir={cache}", *overrides]))


def final_params(run_dir: Path, steps: int = 6) -> dict[str, torch.Tensor]:
    state = torch.load(run_dir / "checkpoints" / f"step_{steps:08d}.pt", weights_only=True)
    return state["model"]


def tensorboard_scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    if tag not in acc.Tags()["scalars"]:
        return []
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def recorded_run(cfg, run_dir: Path):
    """run_training with a task that records every attempt's micro-batch sizes."""
    task = RecordingLM(cfg.task)
    summary = run_training(cfg, run_dir, Observers(hooks=Attempts()), task=task)
    return summary, task.attempts


def test_oom_from_step_k_is_recovered_like_a_run_with_the_smaller_micro_batch_from_k(
    cache_dir, tmp_path
):
    faults = ["faults.oom_above_micro_batch=8", "faults.oom_from_step=3"]
    summary, attempts = recorded_run(tiny_cfg(cache_dir, *faults), tmp_path / "oom")

    assert summary.status == "completed" and summary.oom_count == 1
    assert summary.batch_source == "reduced_after_oom" and summary.micro_batch_size == 8
    assert summary.batch_details.ooms.at_step == 3
    # The failed attempt at step 3 stopped in its first forward; the retry did all 32 samples.
    assert [sizes for step, sizes in attempts if step == 3] == [[], [8, 8, 8, 8]]
    last_attempts = {step: sizes for step, sizes in attempts}
    assert all(sum(sizes) == 32 for sizes in last_attempts.values())
    assert tensorboard_scalars(tmp_path / "oom", "train/oom_count") == [(3, 1.0)]
    on_disk = Summary.read(tmp_path / "oom")
    assert on_disk.oom_count == 1 and on_disk.batch_source == "reduced_after_oom"

    # The reference: no fault, micro-batch 16 switched to 8 from step 3 on.
    run_training(tiny_cfg(cache_dir), tmp_path / "ref", Observers(hooks=MicroBatchFrom(3, 8)))
    torch.testing.assert_close(
        final_params(tmp_path / "oom"), final_params(tmp_path / "ref"), rtol=1e-6, atol=1e-7
    )


class SavedActivations(RecordingLM):
    """Holds weak references to what autograd saved in the latest training forward."""

    def __init__(self, cfg=None) -> None:
        super().__init__(cfg)
        self.refs: list[weakref.ref] = []

    def loss_sum(self, model, inputs, targets):
        if not torch.is_grad_enabled():
            return super().loss_sum(model, inputs, targets)
        self.refs.clear()

        def pack(t):
            if isinstance(t, torch.nn.Parameter):
                return t
            # Detached: an output saved with its own grad_fn would make a cycle gc cannot see.
            held = t.detach()
            self.refs.append(weakref.ref(held))
            return held

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            return super().loss_sum(model, inputs, targets)

    def alive(self) -> int:
        return sum(r() is not None for r in self.refs)


class AfterRelease(StepHooks):
    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []  # (saved by the failed forward, alive now)

    def on_oom(self, run, step: int) -> None:
        self.seen.append((len(run.task.refs), run.task.alive()))


def test_the_failed_steps_tensors_are_released_after_recovery(cache_dir, tmp_path):
    # Fail in backward: the failed forward's activations are then alive in the autograd graph.
    cfg = tiny_cfg(
        tmp_path,
        "faults.oom_above_micro_batch=8",
        "faults.oom_phase=backward",
        "faults.oom_from_step=2",
        "training.max_steps=3",
    )
    hooks = AfterRelease()
    summary = run_training(cfg, tmp_path / "run", Observers(hooks=hooks), SavedActivations())
    assert summary.oom_count == 1 and summary.micro_batch_size == 8
    assert len(hooks.seen) == 1
    saved, alive_after = hooks.seen[0]
    assert saved > 5 and alive_after == 0


@pytest.mark.gpu
def test_gpu_memory_returns_to_its_pre_step_value_after_an_oom(cache_dir, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")

    class Memory(StepHooks):
        def __init__(self) -> None:
            self.before: list[int] = []
            self.after: list[int] = []

        def on_attempt(self, run, step: int) -> None:
            if step == 2 and not self.before:
                self.before.append(torch.cuda.memory_allocated(run.device))

        def on_oom(self, run, step: int) -> None:
            self.after.append(torch.cuda.memory_allocated(run.device))

    memory = Memory()
    cfg = load_config(
        compose(
            "train",
            [
                *AUTO_TINY[1:],
                "gpu=auto",
                "precision=fp32",
                f"data.cache_dir={cache_dir}",
                "faults.oom_above_micro_batch=8",
                "faults.oom_phase=backward",
                "faults.oom_from_step=2",
                "training.max_steps=3",
            ],
        )
    )
    summary = run_training(cfg, tmp_path / "run", Observers(hooks=memory))
    assert summary.oom_count == 1
    assert memory.after == memory.before


def test_oom_at_micro_batch_one_ends_the_run_as_training_oom(cache_dir, tmp_path):
    cfg = tiny_cfg(cache_dir, "training.micro_batch_size=2", "faults.oom_above_micro_batch=0")
    with pytest.raises(TrainingOOM):
        run_training(cfg, tmp_path / "run")
    summary = Summary.read(tmp_path / "run")
    assert summary.status == "oom" and summary.oom_count == 2  # at 2, then at 1


def test_recovery_off_ends_the_run_at_the_first_oom(cache_dir, tmp_path):
    cfg = tiny_cfg(
        tmp_path, "faults.oom_above_micro_batch=8", "training.auto_batch.oom_recovery=false"
    )
    with pytest.raises(TrainingOOM):
        run_training(cfg, tmp_path / "run")


def test_an_oom_in_evaluation_is_recovered_with_the_same_validation_loss(cache_dir, tmp_path):
    faults = ["faults.oom_phase=eval", "faults.oom_above_micro_batch=4", "faults.oom_from_step=3"]
    summary = run_training(tiny_cfg(cache_dir, *faults), tmp_path / "oom")
    assert summary.status == "completed" and summary.oom_count == 2  # 16 -> 8 -> 4
    assert summary.micro_batch_size == 4 and summary.batch_details.ooms.at_step == 3
    # Evaluation at step 3 sums the same tokens in smaller chunks: the same loss.
    ref = run_training(tiny_cfg(cache_dir, "training.max_steps=3"), tmp_path / "ref")
    oom_val = [
        r["val/loss"]
        for r in map(json.loads, (tmp_path / "oom/metrics.jsonl").read_text().splitlines())
        if r["step"] == 3 and "val/loss" in r
    ]
    assert oom_val == pytest.approx([ref.final_val["loss"]], rel=1e-6)


def test_an_auto_run_teaches_the_cache_the_size_that_ran_out(cache_dir, tmp_path):
    faults = [
        "training.micro_batch_size=auto",
        "training.auto_batch.throughput_aware=false",
        "faults.oom_above_micro_batch=8",
        "faults.oom_from_step=3",  # after the probe: it picks 32, the run steps down to 8
    ]
    first = run_training(tiny_cfg(cache_dir, *faults), tmp_path / "a")
    assert first.batch_details.ooms.reduced_from == 16 and first.micro_batch_size == 8
    assert first.oom_count == 2

    second = run_training(tiny_cfg(cache_dir, *faults), tmp_path / "b")
    assert second.batch_source == "cached" and second.micro_batch_size == 8
    assert second.batch_details.probe.probe_steps == 0  # the cache knew this shape: no probe
    assert second.oom_count == 0


def test_a_step_redone_after_an_oom_in_the_optimizer_starts_from_clean_gradients(
    cache_dir, tmp_path
):
    """An OOM in the optimizer phase comes after the whole step's gradients were accumulated:
    the redone step must not add its gradients to them. Without clipping (max_grad_norm=0) a
    doubled gradient shows in the trajectory; AdamW alone would mostly normalize it away."""
    no_clip = ["training.max_grad_norm=0"]
    faults = ["faults.oom_phase=optimizer", "faults.oom_above_micro_batch=8"]
    summary = run_training(
        tiny_cfg(cache_dir, *no_clip, *faults, "faults.oom_from_step=3"), tmp_path / "oom"
    )
    assert summary.oom_count == 1 and summary.batch_details.ooms.at_step == 3
    ref = tiny_cfg(cache_dir, *no_clip)
    run_training(ref, tmp_path / "ref", Observers(hooks=MicroBatchFrom(3, 8)))
    torch.testing.assert_close(
        final_params(tmp_path / "oom"), final_params(tmp_path / "ref"), rtol=1e-6, atol=1e-7
    )
