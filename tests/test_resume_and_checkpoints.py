"""Checkpoints are atomic, pruned to the last K, safe to load, and resume the same trajectory."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch

from app.config import ConfigError
from app.config.training import ResumeFrom
from app.core.outcomes import TrainingOOM
from app.engine.runner import run_training
from app.engine.saving import checkpoint as ckpt
from tests.conftest import config, tiny

pytestmark = pytest.mark.integration


def _final_params(run_dir) -> dict[str, torch.Tensor]:
    return torch.load(ckpt.list_checkpoints(run_dir / "checkpoints")[-1], weights_only=True)[
        "model"
    ]


def test_stop_and_resume_gives_identical_parameters(tmp_path):
    base = tiny(tmp_path, "training.checkpoint_every=3", "model.dropout=0.1")
    straight = run_training(config(base), tmp_path / "straight")
    assert straight.status == "completed"

    # Crash right after the step-3 checkpoint: an injected OOM with recovery off.
    crash = [
        "faults.oom_above_micro_batch=0",
        "faults.oom_from_step=3",
        "training.auto_batch.oom_recovery=false",
    ]
    with pytest.raises(TrainingOOM):
        run_training(config([*base, *crash]), tmp_path / "first")
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "first" / "checkpoints")] == [
        "step_00000003.pt"
    ]
    resumed = run_training(
        config([*base, f"training.resume={tmp_path / 'first'}"]), tmp_path / "second"
    )
    assert resumed.resumed_from_step == 3 and resumed.status == "completed"

    a, b = _final_params(tmp_path / "straight"), _final_params(tmp_path / "second")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=0, msg=name)
    assert resumed.final_val["loss"] == pytest.approx(straight.final_val["loss"], abs=0)


def test_resume_without_the_right_state_would_differ(tmp_path):
    """The check above can fail: restarting from scratch with the same config is not a resume."""
    base = tiny(tmp_path, "training.max_steps=3")
    fresh = run_training(config(base), tmp_path / "a")
    longer = run_training(config(tiny(tmp_path)), tmp_path / "b")
    assert fresh.final_val["loss"] != longer.final_val["loss"]


def test_save_keeps_the_last_k_and_never_leaves_temp_files(tmp_path):
    for step in (1, 2, 3, 4):
        state = ckpt.TrainState(model={"w": torch.ones(3) * step}, step=step)
        ckpt.save_checkpoint(tmp_path, step, state, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000003.pt", "step_00000004.pt"]


def test_a_crash_while_writing_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    ckpt.save_checkpoint(tmp_path, 1, ckpt.TrainState(model={}, step=1), keep=3)

    def boom(*args, **kwargs):
        raise KeyboardInterrupt("killed mid-write")

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save_checkpoint(tmp_path, 2, ckpt.TrainState(model={}, step=2), keep=3)
    names = sorted(p.name for p in ckpt.list_checkpoints(tmp_path))
    assert names == ["step_00000001.pt"]
    assert torch.load(tmp_path / names[0], weights_only=True)["step"] == 1


def test_a_checkpoint_is_on_disk_before_its_name_and_its_name_before_the_old_ones_go(
    tmp_path, monkeypatch
):
    """A power cut must find the new checkpoint whole or the old ones there: the file's bytes
    are flushed (fsync) before the rename gives it its name, and the directory (the rename)
    before the checkpoint it replaces is deleted."""
    ckpt.save_checkpoint(tmp_path, 1, ckpt.TrainState(model={}, step=1), keep=1)
    events: list[tuple[str, str]] = []
    real_fsync, real_replace, real_unlink = os.fsync, os.replace, Path.unlink

    def fsync(fd: int) -> None:
        events.append(("fsync", Path(os.readlink(f"/proc/self/fd/{fd}")).name))
        real_fsync(fd)

    def replace(src, dst) -> None:
        events.append(("rename", Path(dst).name))
        real_replace(src, dst)

    def unlink(path: Path, missing_ok: bool = False) -> None:
        events.append(("delete", path.name))
        real_unlink(path, missing_ok=missing_ok)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(Path, "unlink", unlink)
    ckpt.save_checkpoint(tmp_path, 2, ckpt.TrainState(model={}, step=2), keep=1)
    written = events[0][1]
    assert written.startswith(".step_00000002.pt.") and written.endswith(".tmp")
    assert events == [
        ("fsync", written),  # the bytes, under the temporary name
        ("rename", "step_00000002.pt"),
        ("fsync", tmp_path.name),  # the rename
        ("delete", "step_00000001.pt"),
    ]


class _Evil:
    def __reduce__(self):
        return (print, ("arbitrary code ran",))


def test_loading_refuses_pickled_objects(tmp_path):
    path = tmp_path / "step_00000001.pt"
    with open(path, "wb") as f:
        pickle.dump({"model": _Evil()}, f)
    with pytest.raises(ConfigError, match="unreadable"):
        ckpt.load_checkpoint(path)


def test_resume_auto_without_checkpoints_starts_fresh(tmp_path):
    assert ckpt.find_resume_checkpoint(ResumeFrom(), tmp_path) is None
    with pytest.raises(ConfigError, match=r"training\.resume="):
        ckpt.find_resume_checkpoint(ResumeFrom(str(tmp_path / "nowhere")), tmp_path)
