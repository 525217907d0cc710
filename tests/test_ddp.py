"""torchrun + DDP on CPU (gloo): two ranks train the same trajectory as one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from app import checkpoint as ckpt
from tests.conftest import ROOT, run_cli, tiny


@pytest.mark.slow
def test_two_ranks_match_one_process(tmp_path):
    # Effective batch 9 over 2 ranks: shares 5 and 4, micro-batch 2 -> uneven splits on both.
    args = tiny(
        tmp_path,
        "training.effective_batch_size=9",
        "training.micro_batch_size=2",
        "training.max_steps=4",
        "training.eval_every=2",
    )
    single = run_cli(*args, f"hydra.run.dir={tmp_path / 'single'}")
    assert single.returncode == 0, single.stderr[-2000:]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ddp = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "app.train",
            *args,
            f"hydra.run.dir={tmp_path / 'ddp'}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    summary = json.loads((tmp_path / "ddp" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["effective_batch_size"] == 9
    assert summary["status"] == "completed"
    a = torch.load(
        ckpt.list_checkpoints(tmp_path / "single" / "checkpoints")[-1], weights_only=True
    )["model"]
    b = torch.load(ckpt.list_checkpoints(tmp_path / "ddp" / "checkpoints")[-1], weights_only=True)[
        "model"
    ]
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-4, atol=1e-5, msg=name)
