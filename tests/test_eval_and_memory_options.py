"""training.eval_at_start, training.empty_cache_after_eval and training.expandable_segments."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

import app.engine.runner as runner
import app.engine.train.evaluation as evaluation
from app.components.hardware.cuda_alloc import apply_expandable_segments, merged, target_variable
from app.config import TrainingConfig
from app.engine.records.summary import Summary
from app.engine.runner import run_training
from tests.conftest import ROOT, config, tiny

pytestmark = pytest.mark.integration

ALLOC_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


def val_steps(run_dir) -> list[int]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [x["step"] for x in lines if "val/loss" in x]


def count_empty_cache(monkeypatch) -> list[int]:
    """Counts torch.cuda.empty_cache() calls, with the decision taken as on a CUDA device (the
    setting still decides) so a CPU run exercises the path."""
    calls: list[int] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(1))
    monkeypatch.setattr(
        evaluation, "empties_cache_after_eval", lambda run: run.cfg.empty_cache_after_eval
    )
    return calls


def test_eval_at_start_false_skips_the_step_0_evaluation(tmp_path, monkeypatch):
    calls = count_empty_cache(monkeypatch)
    overrides = tiny(
        tmp_path, "training.eval_at_start=false", "training.empty_cache_after_eval=true"
    )
    summary = run_training(config(overrides), tmp_path / "run")
    assert summary.initial_val["loss"] is None and summary.final_val["loss"] is not None
    assert val_steps(tmp_path / "run") == [3, 6]
    assert Summary.read(tmp_path / "run").initial_val["loss"] is None
    # empty_cache_after_eval: once after each evaluation the run made (finish() adds its own
    # call at the very end, on a machine with CUDA only).
    assert len(calls) == 2 + torch.cuda.is_available()


def test_by_default_the_run_evaluates_at_step_0_and_keeps_the_cache(tmp_path, monkeypatch):
    calls = count_empty_cache(monkeypatch)
    summary = run_training(config(tiny(tmp_path)), tmp_path / "run")
    assert summary.initial_val["loss"] is not None
    assert val_steps(tmp_path / "run") == [0, 3, 6]
    assert len(calls) == int(torch.cuda.is_available())


@pytest.mark.parametrize(
    ("setting", "device", "empties"),
    [(True, "cuda", True), (True, "cpu", False), (False, "cuda", False), (False, "cpu", False)],
)
def test_the_cache_is_emptied_only_when_asked_and_on_cuda(setting, device, empties):
    run = SimpleNamespace(
        cfg=TrainingConfig(empty_cache_after_eval=setting), device=torch.device(device)
    )
    assert evaluation.empties_cache_after_eval(run) is empties


@pytest.mark.parametrize(
    ("current", "setting", "expected"),
    [
        (None, True, "expandable_segments:True"),
        ("", False, "expandable_segments:False"),
        ("max_split_size_mb:128", True, "max_split_size_mb:128,expandable_segments:True"),
        (
            "expandable_segments:True, garbage_collection_threshold:0.8",
            False,
            "garbage_collection_threshold:0.8,expandable_segments:False",
        ),
    ],
)
def test_expandable_segments_is_merged_with_the_other_options(current, setting, expected):
    assert merged(current, setting) == expected


def test_the_variable_torch_reads_first_is_the_one_set():
    assert target_variable({}) == "PYTORCH_CUDA_ALLOC_CONF"
    assert target_variable({"PYTORCH_ALLOC_CONF": "x:1"}) == "PYTORCH_ALLOC_CONF"
    env = {"PYTORCH_ALLOC_CONF": "max_split_size_mb:64"}
    apply_expandable_segments(True, env)
    assert env == {"PYTORCH_ALLOC_CONF": "max_split_size_mb:64,expandable_segments:True"}
    assert apply_expandable_segments(None, env) == env["PYTORCH_ALLOC_CONF"]


class DeviceDetected(Exception):
    pass


@pytest.mark.parametrize(
    ("override", "before", "expected"),
    [
        ("training.expandable_segments=true", None, "expandable_segments:True"),
        (
            "training.expandable_segments=false",
            "max_split_size_mb:128,expandable_segments:True",
            "max_split_size_mb:128,expandable_segments:False",
        ),
        (
            "training.expandable_segments=null",
            "expandable_segments:True",
            "expandable_segments:True",
        ),
        ("training.expandable_segments=null", None, None),
    ],
)
def test_a_run_sets_the_allocator_variable_before_the_device_is_touched(
    tmp_path, monkeypatch, override, before, expected
):
    for name in ALLOC_VARS:
        monkeypatch.delenv(name, raising=False)
    if before is not None:
        monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", before)
    seen = {}

    def detect(gpu):  # the first step that may start CUDA: stop the run there
        seen["env"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
        raise DeviceDetected

    monkeypatch.setattr(runner, "detect_device", detect)
    with pytest.raises(DeviceDetected):
        run_training(config(tiny(tmp_path, override)), tmp_path / "run")
    assert seen["env"] == expected


@pytest.mark.gpu
def test_the_allocator_uses_expandable_segments_when_asked(tmp_path):
    code = (
        "import os, torch\n"
        "from app.components.hardware.cuda_alloc import apply_expandable_segments\n"
        "apply_expandable_segments(True)\n"
        "x = torch.empty(64 * 2**20, device='cuda')\n"
        "print(all(s.get('is_expandable') for s in torch.cuda.memory_snapshot()))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ALLOC_VARS}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.stdout.strip() == "True", out.stderr
