"""The host malloc policy: `retain` stops the per-step page faults of glibc's defaults."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest
from conftest import ROOT, config, tiny

from app.components.hardware import host_malloc

pytestmark = pytest.mark.e2e

glibc_only = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="mallopt is glibc's",
)

# Free and re-allocate a 40 MiB activation-sized tensor, as a training step does. 40 MiB is above
# the 32 MiB ceiling of glibc's adaptive mmap threshold, so by default every allocation is a
# fresh mmap whose pages fault in again when written.
# The policy is applied where a run applies it: in a process that has imported the trainer (the
# layout of its heap decides whether a freed top block can grow back in place).
FAULTS_PER_ALLOCATION = """
import json, resource, sys
import torch
import app.engine.runner
from app.components.hardware.host_malloc import apply_host_malloc
applied = apply_host_malloc(sys.argv[1])
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    torch.empty(10 * 2**20).fill_(1.0)  # 40 MiB of float32
before = faults()
for _ in range(10):
    torch.empty(10 * 2**20).fill_(1.0)
print(json.dumps({"applied": applied, "faults": (faults() - before) / 10}))
"""


def _faults_per_allocation(policy: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", FAULTS_PER_ALLOCATION, policy],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@glibc_only
def test_retain_removes_the_page_faults_of_reallocation():
    default = _faults_per_allocation("default")
    retain = _faults_per_allocation("retain")
    pages = 40 * 2**20 // 4096
    assert default["applied"] is False and retain["applied"] is True
    assert default["faults"] > pages / 2  # every allocation faults its pages in again
    assert retain["faults"] < pages / 100  # the freed block is reused as it is


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="host_malloc='jemalloc'"):
        host_malloc.apply_host_malloc("jemalloc")


def test_default_policy_leaves_malloc_alone(monkeypatch):
    monkeypatch.setattr(host_malloc, "_applied", None)
    monkeypatch.setattr(host_malloc, "_glibc_mallopt", lambda: pytest.fail("mallopt called"))
    assert host_malloc.apply_host_malloc("default") is False


def test_without_glibc_nothing_is_applied(monkeypatch):
    monkeypatch.setattr(host_malloc, "_applied", None)
    monkeypatch.setattr(host_malloc, "_glibc_mallopt", lambda: None)
    assert host_malloc.apply_host_malloc("retain") is False


def test_a_training_run_applies_its_policy_before_loading_data(monkeypatch, tmp_path):
    import app.engine.runner as runner
    from app.components.tasks.causal_lm import CausalLM

    calls = []
    monkeypatch.setattr(runner, "apply_host_malloc", lambda policy: calls.append(policy))

    class Checked(CausalLM):
        def load_data(self, data):
            assert calls == ["default"], "the policy must be in force before the data allocates"
            return super().load_data(data)

    cfg = config(tiny(tmp_path, "training.host_malloc=default", "training.max_steps=1"))
    runner.run_training(cfg, tmp_path / "run", task=Checked(cfg.task))
    assert calls == ["default"]
