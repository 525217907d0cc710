"""training.micro_batch_size=auto with model.compile=true: the probe searches eagerly, confirms
its choice once on the compiled module the run keeps, and the probe and the run together
compile two graphs (one to train, one to evaluate) whatever the sizes they meet.

The fast tiers compile with dynamo's "eager" backend (the `dynamo_only` fixture: graphs captured
and counted as with inductor, no compiler started); the e2e test at the end compiles for real."""

from __future__ import annotations

import json

import pytest
import torch

from app.config.phases import BatchPhases
from app.engine.batch.probe import auto_plan
from app.engine.runner import run_training
from tests import procs
from tests.conftest import AUTO_TINY, config, tiny
from tests.fakes import RecordingLM
from tests.test_adaptive_batch import ADAPTIVE
from tests.test_autobatch import parts, tiny_cfg

pytestmark = pytest.mark.integration

# The probe finds 12 (13 runs out of memory): 32 samples train as 11 + 11 + 10 and the 30
# validation samples evaluate as 11 + 11 + 8, so the run meets three training sizes and two
# evaluation sizes, none of them a size the confirmation alone saw.
UNEVEN = [
    "model.compile=true",
    "training.micro_batch_size=auto",
    "training.auto_batch.throughput_aware=false",
    "faults.oom_above_micro_batch=12",
    "training.eval_samples=30",
]


def test_the_probe_and_the_run_compile_two_graphs_together(cache_dir, tmp_path, dynamo_only):
    summary = run_training(tiny_cfg(cache_dir, *UNEVEN), tmp_path / "run")
    assert summary.status == "completed"
    assert summary.micro_batch_sizes == [11, 11, 10] and summary.eval_micro_batch_size == 11
    assert summary.compiled_graphs == 2  # the probe's and the run's together
    # ... all of them the probe's: the run's first step trains the graphs the probe compiled.
    probe = summary.batch_details.probe
    assert probe is not None and probe.graphs_compiled == 2 and probe.confirm_seconds > 0


def test_an_adaptive_batch_grows_its_micro_batch_on_the_same_two_graphs(tmp_path, dynamo_only):
    """Batch 4 -> 8 -> 16, micro-batch half of it (the noise scale wants two) up to 8: each
    growth is a new batch size for the compiled module, and none compiles again."""
    grows = [
        "training.auto_batch.cpu_max_micro_batch=8",
        "training.auto_batch.throughput_aware=false",
    ]
    args = tiny(tmp_path, *ADAPTIVE, *UNEVEN[:2], *grows)
    summary = run_training(config(args), tmp_path / "run")
    assert [p.batch for p in BatchPhases.from_json(summary.batch_schedule or []).phases] == [
        4,
        8,
        16,
    ]
    assert summary.micro_batch_sizes == [8, 8]  # grown from 2
    assert summary.batch_details.probe.graphs_compiled == summary.compiled_graphs == 2


class HeavierCompiled(RecordingLM):
    """The causal LM task, noting whether each training forward ran the compiled module."""

    def __init__(self) -> None:
        super().__init__()
        self.compiled: list[bool] = []

    def loss_sum(self, model, inputs, targets):
        if torch.is_grad_enabled():
            self.compiled.append(hasattr(model, "_orig_mod"))  # what torch.compile wraps
        return super().loss_sum(model, inputs, targets)


class CompiledMemory:
    """A meter whose peak grows 5 % of the machine per sample, twice that on the compiled
    module: eagerly 10 samples fit under 0.5, compiled only 5."""

    def __init__(self, task: HeavierCompiled) -> None:
        self.task = task

    def reset(self) -> None:
        pass

    def sync(self) -> None:
        pass

    def peak_fraction(self) -> float:
        return self.task.forwards[-1] * 0.05 * (2 if self.task.compiled[-1] else 1)


def test_a_confirmation_over_the_limit_backs_off_and_the_cache_keeps_it(cache_dir, dynamo_only):
    cfg = tiny_cfg(cache_dir, *UNEVEN[:3], "training.auto_batch.cpu_memory_fraction=0.5")
    task = HeavierCompiled()
    plan = auto_plan(*parts(cfg, task), CompiledMemory(task))
    rows = {r.micro: r for r in plan.probe.candidates}
    # Eagerly 10 fits (so 32 = 8 x 4 is chosen) and 11 does not; 8 compiled peaks at 0.8, so
    # no size from 8 up fits any more and 4 is confirmed instead.
    assert rows[10].peak_fraction == pytest.approx(0.5) and max(rows) == 16
    assert [m for m, r in rows.items() if r.fits] == [1, 2, 4]
    assert not rows[8].fits and not rows[8].oom and rows[8].peak_fraction == pytest.approx(0.8)
    assert plan.micro_batch_size == 4 and rows[4].peak_fraction == pytest.approx(0.4)
    compiled_sizes = [n for n, c in zip(task.forwards, task.compiled, strict=True) if c]
    assert compiled_sizes == [8, 8, 4, 4]  # two steps each, on the same graph
    assert plan.probe.graphs_compiled == 2

    cached = auto_plan(*parts(cfg, HeavierCompiled()))
    assert cached.source == "cached" and cached.micro_batch_size == 4


class OutOfMemoryCompiled(HeavierCompiled):
    """The compiled module runs out of memory above 5 samples; the uncompiled one never."""

    def loss_sum(self, model, inputs, targets):
        if hasattr(model, "_orig_mod") and len(inputs) > 5:
            raise torch.OutOfMemoryError("out of memory (compiled, test)")
        return super().loss_sum(model, inputs, targets)


def test_a_confirmation_out_of_memory_backs_off_like_a_probed_one(cache_dir, dynamo_only):
    cfg = tiny_cfg(cache_dir, *UNEVEN[:3], "training.effective_batch_size=16")
    setup, model, data = parts(cfg, OutOfMemoryCompiled())
    plan = auto_plan(setup, model, data)
    rows = {r.micro: r for r in plan.probe.candidates}
    assert rows[16].oom and not rows[16].fits  # found eagerly fitting, failed compiled
    assert rows[8].oom and plan.micro_batch_size == 4
    assert all(p.grad is None for p in model.parameters())  # released after each OOM
    entry = json.loads(next((cache_dir / "autobatch").glob("*.json")).read_text())
    assert entry["trials"]["16"]["oom"] and entry["trials"]["8"]["oom"]


@pytest.mark.e2e
@pytest.mark.slow
def test_inductor_compiles_two_graphs_for_the_probe_and_the_run(tmp_path):
    """The proof with the real compiler (inductor and a C++ compiler, its workers started),
    from a cold compile cache: as the fast tiers count with dynamo alone."""
    run_dir = tmp_path / "run"
    args = [*AUTO_TINY, *UNEVEN, f"data.cache_dir={tmp_path / 'cache'}", "training.max_steps=3"]
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    proc = procs.train(*args, f"hydra.run.dir={run_dir}", env=env, timeout=900)
    assert proc.returncode == 0, procs.failure(proc)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["micro_batch_sizes"] == [11, 11, 10]
    assert summary["batch_details"]["graphs_compiled"] == summary["compiled_graphs"] == 2
