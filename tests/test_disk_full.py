"""A checkpoint write that fails (disk full) ends the run with one line; nothing saved is lost."""

from __future__ import annotations

import errno
import os
import subprocess
import uuid
from pathlib import Path

import pytest
import torch

from app.core.outcomes import WriteFailed
from app.engine.saving import checkpoint as ckpt
from tests import procs
from tests.conftest import tiny

pytestmark = pytest.mark.e2e


def _state(step: int) -> ckpt.TrainState:
    return ckpt.TrainState(model={"w": torch.full((64, 64), float(step))}, step=step)


def test_enospc_mid_write_raises_one_line_and_keeps_the_earlier_checkpoints(tmp_path, monkeypatch):
    directory = tmp_path / "checkpoints"
    ckpt.save_checkpoint(directory, 1, _state(1), keep=2)
    real_save = torch.save

    def fills_the_disk(obj, f):
        real_save(obj, f)  # the bytes are written, then the device is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(ckpt.torch, "save", fills_the_disk)
    with pytest.raises(WriteFailed) as exc:
        ckpt.save_checkpoint(directory, 2, _state(2), keep=1)
    message = str(exc.value)
    assert "\n" not in message and "No space left on device" in message
    assert "step_00000002.pt" in message
    assert sorted(p.name for p in directory.iterdir()) == ["step_00000001.pt"]  # no temporary
    assert torch.load(directory / "step_00000001.pt", weights_only=True)["step"] == 1


def test_temporaries_of_a_killed_write_are_removed_by_the_next_save(tmp_path):
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    (directory / ".step_00000003.pt.abc123.tmp").write_bytes(b"half a checkpoint")
    (directory / "notes.tmp").write_text("not ours")
    ckpt.save_checkpoint(directory, 4, _state(4), keep=2)
    assert sorted(p.name for p in directory.iterdir()) == ["notes.tmp", "step_00000004.pt"]


@pytest.fixture
def small_filesystem(tmp_path):
    """A 600 KiB tmpfs: room for one tiny-model checkpoint (~380 KiB), not for two."""
    mount = tmp_path / f"small-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True)


@pytest.mark.slow
def test_a_run_that_fills_its_filesystem_ends_in_one_line(tmp_path, small_filesystem):
    run_dir = small_filesystem / "run"
    proc = procs.train(
        *tiny(tmp_path, "training.checkpoint_every=2", "training.keep_checkpoints=3"),
        f"hydra.run.dir={run_dir}",
    )
    assert proc.returncode == 1, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "No space left on device" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    saved = ckpt.list_checkpoints(run_dir / "checkpoints")
    assert [p.name for p in saved] == ["step_00000002.pt"]
    assert ckpt.load_checkpoint(saved[0]).step == 2
    leftovers = [p.name for p in (run_dir / "checkpoints").iterdir() if p.suffix == ".tmp"]
    assert leftovers == []
    assert Path(run_dir / "checkpoints").is_dir()
