"""app/core/run_dir_guard.py: what a refused start wrote is put back; nothing else is touched."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.core import run_dir_guard
from app.core.run_dir_guard import RunDirSnapshot

pytestmark = pytest.mark.unit


def _finished(root: Path) -> None:
    (root / ".hydra").mkdir(parents=True)
    (root / ".hydra" / "config.yaml").write_text("lr: 0.001\n")
    (root / "train.log").write_text("the finished run\n")
    (root / "tensorboard").mkdir()
    (root / "tensorboard" / "events.1").write_bytes(b"old")
    (root / "checkpoints").mkdir()


def _arm(root: Path) -> None:
    run_dir_guard.arm(root)


def test_a_refusal_puts_back_what_the_start_wrote_and_nothing_else(tmp_path):
    root = tmp_path / "run"
    _finished(root)
    _arm(root)
    (root / ".hydra" / "config.yaml").write_text("lr: 1e9\n")  # Hydra's rewrite
    (root / ".hydra" / "overrides.yaml").write_text("- training.lr=1e9\n")
    with open(root / "train.log", "a") as log:
        log.write("the refused start\n")
    (root / "tensorboard" / "events.2").write_bytes(b"new")
    (root / "wandb" / "offline-run").mkdir(parents=True)
    (root / "notes.txt").write_text("the user's")  # not the run's: kept
    (root / "checkpoints" / "step_1.pt").write_bytes(b"")  # not written before training: kept
    run_dir_guard.restore_after_refusal()
    assert (root / ".hydra" / "config.yaml").read_text() == "lr: 0.001\n"
    assert not (root / ".hydra" / "overrides.yaml").exists()
    assert (root / "train.log").read_text() == "the finished run\n"
    assert sorted(p.name for p in (root / "tensorboard").iterdir()) == ["events.1"]
    assert not (root / "wandb").exists()
    assert (root / "notes.txt").exists() and (root / "checkpoints" / "step_1.pt").exists()


def test_a_directory_the_refused_start_created_is_removed(tmp_path):
    root = tmp_path / "new" / "run"
    _arm(root)
    (root / ".hydra").mkdir(parents=True)
    (root / ".hydra" / "config.yaml").write_text("x: 1\n")
    (root / "train.log").write_text("refused\n")
    run_dir_guard.restore_after_refusal()
    assert not root.exists() and (tmp_path / "new").is_dir()


def test_once_training_starts_nothing_is_put_back(tmp_path):
    root = tmp_path / "run"
    _finished(root)
    _arm(root)
    run_dir_guard.disarm()
    (root / "tensorboard" / "events.2").write_bytes(b"the run's own")
    run_dir_guard.restore_after_refusal()
    assert (root / "tensorboard" / "events.2").exists()


def test_only_the_first_rank_puts_it_back(tmp_path, monkeypatch):
    root = tmp_path / "run"
    _finished(root)
    _arm(root)
    (root / "tensorboard" / "events.2").write_bytes(b"new")
    monkeypatch.setenv("RANK", "1")
    run_dir_guard.restore_after_refusal()
    assert (root / "tensorboard" / "events.2").exists()


def test_the_snapshot_of_a_missing_directory_is_empty(tmp_path):
    snap = RunDirSnapshot.take(tmp_path / "absent")
    assert not snap.existed and not snap.sizes and not snap.kept
