"""training.batch_schedule=adaptive in real runs: the batch doubles on the measured noise scale,
each step sees the batch of its phase from the one stream of samples, the learning rate follows
lr_scaling on the data schedule, every record shows the changes, and a resume across a doubling
ends bit-identical to the run that was not stopped."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch

from app.config import ConfigError
from app.config.phases import BatchPhases
from app.core.outcomes import TrainingOOM
from app.engine.records.summary import Summary
from app.engine.run import Observers, Run, Samples, StepHooks
from app.engine.runner import run_training
from app.engine.saving import checkpoint as ckpt
from tests.conftest import config, tiny

pytestmark = pytest.mark.integration

# Batch 4 (micro-batch 2: two a step, so the noise scale is measured), doubled whenever the
# estimate is positive for 2 steps of the reference batch (8 samples), up to 16: the tiny model's
# noise scale is far above a bar of 1e-6 x the batch, so the changes come early and often.
ADAPTIVE = [
    "training.effective_batch_size=4",
    "training.micro_batch_size=2",
    "training.max_steps=null",
    "training.max_samples=200",
    "training.reference_batch=4",
    "training.log_every=2",
    "training.eval_every=10",
    "training.warmup_steps=4",
    "training.lr_scaling=sqrt",
    "training.batch_schedule=adaptive",
    "training.adaptive_batch.noise_fraction=1e-6",
    "training.adaptive_batch.patience_steps=2",
    "training.max_effective_batch=16",
]


class Watch(StepHooks):
    """Each step's samples (all of this rank's) and the learning rate it trains at."""

    def __init__(self) -> None:
        self.samples: list[torch.Tensor] = []
        self.lrs: list[float] = []
        self.micros: list[int] = []  # the plan's micro-batch as the step starts

    def on_step_start(self, run: Run, step: int, batch: Samples) -> None:
        assert isinstance(batch, torch.Tensor)
        self.samples.append(batch.clone())
        self.lrs.append(float(run.optimizer.param_groups[0]["lr"]))
        self.micros.append(run.plan.micro_batch_size)


def _run(tmp_path, name: str, *extra: str) -> tuple[Summary, Watch]:
    watch = Watch()
    summary = run_training(
        config(tiny(tmp_path, *ADAPTIVE, *extra)), tmp_path / name, Observers(hooks=watch)
    )
    return summary, watch


def test_the_batch_doubles_and_each_step_takes_its_phase_from_the_one_stream(tmp_path):
    summary, watch = _run(tmp_path, "adaptive")
    assert summary.status == "completed"
    phases = BatchPhases.from_json(summary.batch_schedule or [])
    assert [p.batch for p in phases.phases] == [4, 8, 16]
    sizes = [len(s) for s in watch.samples]
    assert sizes == [phases.batch_at(step) for step in range(len(sizes))]
    # The data seen is exact: the budget and no more than the last step's overshoot.
    assert summary.samples_seen == sum(sizes) == phases.samples_seen(summary.steps)
    assert 200 <= summary.samples_seen < 200 + 16
    assert summary.steps == summary.max_steps == len(sizes)
    # The same samples, in the same order, as a run that kept batch 4 throughout.
    _, fixed = _run(tmp_path, "fixed", "training.batch_schedule=fixed", "training.max_samples=216")
    stream, fixed_stream = torch.cat(watch.samples), torch.cat(fixed.samples)
    assert torch.equal(stream, fixed_stream[: len(stream)])


def _cosine(settings: dict[str, float], position: float, ahead: float) -> float:
    """The schedule's shape written out: warm-up to 1 over `warmup` steps of the first batch,
    then cosine to min_ratio at `end` (position and end in steps of the first batch)."""
    warmup, end, low = settings["warmup"], settings["end"], settings["min_ratio"]
    if position < warmup:
        return min(1.0, ahead / warmup)
    progress = min(1.0, (position - warmup) / max(1, end - warmup))
    return low + (1 - low) * 0.5 * (1 + math.cos(math.pi * progress))


def _auto(tmp_path) -> list[str]:
    """The micro-batch probed (up to 8 on this CPU, by size alone: no timing in the choice)."""
    return [
        "training.micro_batch_size=auto",
        "training.auto_batch.cpu_max_micro_batch=8",
        "training.auto_batch.throughput_aware=false",
        f"training.auto_batch.cache_dir={tmp_path / 'autobatch'}",
    ]


def test_with_a_probed_micro_batch_the_micro_batch_grows_with_the_batch(tmp_path):
    summary, watch = _run(tmp_path, "auto", *_auto(tmp_path))
    phases = BatchPhases.from_json(summary.batch_schedule or [])
    assert [p.batch for p in phases.phases] == [4, 8, 16]
    # Half the batch (the noise scale needs two micro-batches a step) up to the probe's 8
    want = [min(8, phases.batch_at(step) // 2) for step in range(summary.steps)]
    assert watch.micros == want
    # The same samples as the run whose micro-batch stayed at 2, and the data seen exact
    _, kept = _run(tmp_path, "kept")
    assert torch.equal(torch.cat(watch.samples), torch.cat(kept.samples))
    assert summary.samples_seen == sum(len(s) for s in watch.samples)
    assert set(kept.micros) == {2}


def test_an_oom_after_a_doubling_shrinks_the_micro_batch_and_it_does_not_grow_back(tmp_path):
    # Micro-batches above 2 run out from step 3 on (after the probe, which found 8 fits): batch
    # 8's micro-batch 4 runs out and is halved; batch 16 stays at 2, where it ran
    oom = ["faults.oom_above_micro_batch=2", "faults.oom_from_step=3"]
    summary, watch = _run(tmp_path, "oom", *_auto(tmp_path), *oom)
    assert summary.status == "completed"
    phases = BatchPhases.from_json(summary.batch_schedule or [])
    assert [p.batch for p in phases.phases] == [4, 8, 16]
    assert summary.oom_count == 1
    struck = next(s for s, m in enumerate(watch.micros) if s >= 3 and m > 2)
    assert watch.micros[struck + 1 :] == [2] * (summary.steps - struck - 1)
    # The effective batch kept through it all
    assert [len(s) for s in watch.samples] == [phases.batch_at(s) for s in range(summary.steps)]


def test_the_learning_rate_follows_lr_scaling_at_each_change_on_the_data_schedule(tmp_path):
    summary, watch = _run(tmp_path, "adaptive")
    phases = BatchPhases.from_json(summary.batch_schedule or [])
    first = phases.first.batch
    lr0 = summary.lr  # training.lr at the first batch (sqrt of 4 / reference 4: the same)
    assert lr0 is not None
    # The decay ends where the budget (200 samples) ends, in steps of the first batch.
    settings = {"warmup": 4.0, "end": 200 / first, "min_ratio": 0.1}
    for step, lr in enumerate(watch.lrs):
        at = phases.samples_seen(step) / first
        ahead = phases.samples_seen(step + 1) / first
        scale = math.sqrt(phases.batch_at(step) / first)
        want = lr0 * _cosine(settings, at, ahead) * scale
        assert lr == pytest.approx(want, rel=1e-9), (step, phases.batch_at(step))
    # At each change the rate steps by lr_scaling's factor and by nothing else.
    for phase in phases.phases[1:]:
        before, after = watch.lrs[phase.step - 1], watch.lrs[phase.step]
        assert after / before == pytest.approx(math.sqrt(2), rel=0.05)


def test_every_record_shows_the_batch_and_each_change(tmp_path):
    summary, _ = _run(tmp_path, "adaptive")
    rows = [json.loads(ln) for ln in (tmp_path / "adaptive" / "metrics.jsonl").open()]
    changes = [r for r in rows if "batch/changed_from" in r]
    phases = summary.batch_schedule or []
    assert [
        (r["step"], r["batch/changed_from"], r["batch/effective_batch_size"]) for r in changes
    ] == [(p["step"], b["batch"], p["batch"]) for b, p in itertools.pairwise(phases)]
    for r in changes:
        assert r["data/samples_seen"] == next(
            p["samples"] for p in phases if p["step"] == r["step"]
        )
    logged = {r["step"]: r["train/effective_batch_size"] for r in rows if "train/loss" in r}
    by_phase = BatchPhases.from_json(phases)
    assert logged and all(b == by_phase.batch_at(step - 1) for step, b in logged.items())
    saved = json.loads((tmp_path / "adaptive" / "summary.json").read_text())
    assert saved["batch_schedule"] == phases and saved["max_steps"] == summary.steps


@pytest.mark.parametrize("micro", ["fixed", "auto"])
def test_a_resume_across_a_doubling_ends_bit_identical(tmp_path, micro):
    base = ["training.checkpoint_every=3", "model.dropout=0.1"]
    base += _auto(tmp_path) if micro == "auto" else []
    straight, _ = _run(tmp_path, "straight", *base)
    phases = BatchPhases.from_json(straight.batch_schedule or [])
    assert len(phases.phases) == 3
    # A crash at step 5 (injected OOMs, recovery off): its last checkpoint, of step 5 (24
    # samples: checkpoints every 12), holds one doubling and the rule's wait for the next.
    assert phases.phases[1].step < 5 < phases.last.step
    crash = [
        "faults.oom_above_micro_batch=0",
        "faults.oom_from_step=5",
        "training.auto_batch.oom_recovery=false",
    ]
    with pytest.raises(TrainingOOM):
        _run(tmp_path, "first", *base, *crash)
    resumed, _ = _run(tmp_path, "second", *base, f"training.resume={tmp_path / 'first'}")
    assert resumed.status == "completed"
    assert resumed.resumed_from_step == 5
    assert resumed.batch_schedule == straight.batch_schedule
    assert resumed.steps == straight.steps and resumed.samples_seen == straight.samples_seen
    a = torch.load(
        ckpt.list_checkpoints(tmp_path / "straight" / "checkpoints")[-1], weights_only=True
    )
    b = torch.load(
        ckpt.list_checkpoints(tmp_path / "second" / "checkpoints")[-1], weights_only=True
    )
    for name in a["model"]:
        torch.testing.assert_close(b["model"][name], a["model"][name], rtol=0, atol=0, msg=name)
    assert resumed.final_val["loss"] == straight.final_val["loss"]


def test_a_checkpoint_of_a_grown_batch_resumes_only_as_adaptive(tmp_path):
    straight, _ = _run(tmp_path, "straight", "training.checkpoint_every=3")
    assert straight.status == "completed"
    with pytest.raises(ConfigError, match=r"resume with training\.batch_schedule=adaptive"):
        _run(
            tmp_path,
            "again",
            "training.batch_schedule=fixed",
            f"training.resume={tmp_path / 'straight' / 'checkpoints'}",
        )


def test_without_a_data_budget_it_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"so its budget must be data, but it is 6 steps"):
        config(tiny(tmp_path, "training.batch_schedule=adaptive"))


class Betas(StepHooks):
    def __init__(self) -> None:
        self.betas: set[float] = set()

    def on_step_start(self, run: Run, step: int, batch: Samples) -> None:
        assert run.noise is not None
        self.betas.add(run.noise.beta)


@pytest.mark.parametrize(
    ("schedule", "want"), [("adaptive", 0.9), ("fixed", 0.95)], ids=["adaptive", "fixed"]
)
def test_the_rule_reads_the_noise_scale_at_its_own_smoothing(tmp_path, capsys, schedule, want):
    # An adaptive run averages the estimate over adaptive_batch.smoothing; a fixed run that
    # measures the noise scale keeps the log line's 0.95 whatever that setting says
    hooks = Betas()
    extra = [
        f"training.batch_schedule={schedule}",
        "training.noise_scale=true",
        "training.adaptive_batch.smoothing=0.9",
        "training.max_samples=40",
    ]
    run_training(config(tiny(tmp_path, *ADAPTIVE, *extra)), tmp_path / "r", Observers(hooks=hooks))
    assert hooks.betas == {want}
    # The banner's schedule line states the average the rule reads
    banner = "the noise scale (averaged over ~10 steps)" in capsys.readouterr().out
    assert banner == (schedule == "adaptive")


def test_a_smoothing_of_one_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"training\.adaptive_batch\.smoothing"):
        config(tiny(tmp_path, *ADAPTIVE, "training.adaptive_batch.smoothing=1.0"))
