"""training.micro_batch_size=auto: the probe, the choice, the cache (app/engine/batch/)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch

from app.components.optim import OPTIMIZERS
from app.config import load_config
from app.config.compose import compose
from app.core.outcomes import TrainingOOM
from app.engine.batch import cache as batch_cache
from app.engine.batch import choice
from app.engine.batch.probe import auto_plan
from app.engine.records.summary import Summary
from app.engine.run import Observers
from app.engine.saving import checkpoint as ckpt
from tests.conftest import AUTO_TINY
from tests.fakes import Attempts, RecordingLM

pytestmark = pytest.mark.integration


def tiny_cfg(cache: Path, *overrides: str, base: list[str] = AUTO_TINY):
    return load_config(compose("train", [*base, f"data.cache_dir={cache}", *overrides]))


def parts(cfg, task=None):
    """What runner.build_run hands to auto_plan, without the rest of the run."""
    from app.components.hardware.devices import detect_device, effective_preset
    from app.components.hardware.precision import resolve_precision
    from app.components.tasks import build_task
    from app.engine.run import Machine
    from app.engine.runner import probe_setup

    device = detect_device(cfg.gpu)
    preset = effective_preset(cfg.gpu, device)
    machine = Machine(device, preset, resolve_precision(cfg.precision.name, device, preset))
    setup = probe_setup(cfg, machine, task or build_task(cfg.task), cfg.budget())
    data = setup.task.load_data(cfg.data)
    torch.manual_seed(cfg.training.seed)
    model = setup.task.build_model(cfg.model, data)
    return setup, model, data


def plan_for(cfg, task=None, meter=None):
    return auto_plan(*parts(cfg, task), meter)


@pytest.fixture
def probing():
    """A task whose training forwards the probe runs are counted: every probe step of a
    candidate trains one micro-batch of that size."""
    return RecordingLM()


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# --- the choice (pure) -----------------------------------------------------------------------


def trial(sps=None, oom=False, peak=0.1):
    return {"oom": oom, "peak_fraction": None if oom else peak, "samples_per_sec": sps}


def test_choice_takes_the_fastest_fit_near_the_top_not_the_largest():
    trials = {8: trial(900.0), 16: trial(1000.0), 32: trial(700.0), 64: trial(oom=True)}
    assert choice.choose(trials, 0.9, 64, 64, throughput_aware=True) == (16, "throughput")
    assert choice.choose(trials, 0.9, 64, 64, throughput_aware=False) == (32, "largest")


def test_choice_honours_the_memory_margin_and_sticky_failures():
    # 32 did not crash but left less than the margin free; 8 fits yet lies above a failure at 6.
    trials = {4: trial(peak=0.5), 16: trial(peak=0.8), 32: trial(peak=0.95)}
    assert choice.choose(trials, 0.9, 64, 64, throughput_aware=False) == (16, "largest")
    trials |= {6: trial(oom=True), 8: trial(peak=0.6)}
    assert choice.choose(trials, 0.9, 64, 64, throughput_aware=False) == (4, "largest")


def test_choice_trims_to_the_split_and_raises_when_nothing_fits():
    assert choice.fit_split(32, 12) == 11  # 32 = 11 + 11 + 10
    assert choice.split_candidates(32, 12) == [11, 8, 7]
    trials = {12: trial(), 13: trial(oom=True)}
    assert choice.choose(trials, 0.9, 32, 32, throughput_aware=False) == (11, "largest")
    with pytest.raises(TrainingOOM):
        choice.choose({1: trial(oom=True)}, 0.9, 32, 32, throughput_aware=True)


# --- the probe -------------------------------------------------------------------------------


def test_probe_honours_injected_ooms_and_leaves_model_optimizer_and_rng_untouched(
    cache_dir, probing
):
    cfg = tiny_cfg(cache_dir, "training.micro_batch_size=auto", "faults.oom_above_micro_batch=12")
    setup, model, data = parts(cfg, probing)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = ckpt.rng_state()
    plan = auto_plan(setup, model, data)

    assert plan.source == "probed" and plan.micro_batch_size <= 12
    assert sum(plan.micro_sizes) == 32 and max(plan.micro_sizes) == plan.micro_batch_size
    rows = {r.micro: r for r in plan.probe.candidates}
    assert rows[12].fits and rows[13].oom and not rows[13].fits  # bisected to 12|13
    assert all(r.oom for m, r in rows.items() if m > 12)
    assert max(rows) > 12 and rows[max(rows)].oom  # it really tried (and failed) above 12
    assert max(probing.forwards) <= 12  # injected OOMs fire before the forward
    torch.testing.assert_close(model.state_dict(), before, rtol=0, atol=0)
    assert all(p.grad is None for p in model.parameters())
    assert model.training
    assert torch.equal(torch.get_rng_state(), rng["torch"])


def test_probe_optimizer_state_does_not_leak_into_the_run(cache_dir):
    # build_run makes the run's optimizer after the probe: it must start empty.
    cfg = tiny_cfg(cache_dir, "training.micro_batch_size=auto")
    setup, model, data = parts(cfg)
    auto_plan(setup, model, data)
    assert not OPTIMIZERS.get(cfg.training.optimizer).create(model, cfg.training).state


def test_cpu_probe_of_the_default_model_stays_within_its_bounds(cache_dir, probing):
    base = ["gpu=cpu", "data.builtin_num_docs=300"]  # the default tiny_gpt2 at seq_len 128
    cfg = tiny_cfg(cache_dir, "training.micro_batch_size=auto", base=base)
    plan = plan_for(cfg, probing)
    ab = cfg.training.auto_batch
    probe = plan.probe
    assert probe is not None
    assert probe.probe_steps <= ab.max_probe_steps  # its seconds: on a clock of its own, below
    assert len(probing.forwards) == probe.probe_steps
    assert max(probing.forwards) <= min(ab.cpu_max_micro_batch, cfg.training.effective_batch_size)


def test_probe_stops_at_its_step_bound_with_the_best_fit_so_far(cache_dir, probing):
    cfg = tiny_cfg(
        cache_dir,
        "training.micro_batch_size=auto",
        "training.auto_batch.max_probe_steps=5",
        "training.auto_batch.throughput_aware=false",
    )
    plan = plan_for(cfg, probing)
    assert len(probing.forwards) == plan.probe.probe_steps <= 5
    assert plan.micro_batch_size == 2  # 1 and 2 fit (2 steps each); 4 would pass the bound


# --- end to end: faults.oom_above_micro_batch=12 --------------------------------------------


def run_recording_steps(cfg, run_dir: Path):
    """run_training, recording the micro-batch sizes of each optimizer step's attempts."""
    from app.engine.runner import run_training

    task = RecordingLM(cfg.task)
    summary = run_training(cfg, run_dir, Observers(hooks=Attempts()), task=task)
    return summary, [sizes for _, sizes in task.attempts]


def test_auto_under_injected_oom_trains_exactly_like_that_micro_batch_fixed(cache_dir, tmp_path):
    faults = ["faults.oom_above_micro_batch=12", "training.auto_batch.throughput_aware=false"]
    cfg = tiny_cfg(cache_dir, "training.micro_batch_size=auto", *faults)
    auto, steps = run_recording_steps(cfg, tmp_path / "auto")
    assert auto.batch_source == "probed" and auto.micro_batch_size == 11
    assert auto.micro_batch_sizes == [11, 11, 10]  # the uneven split keeps 32 exact
    assert steps == [[11, 11, 10]] * 6 and auto.oom_count == 0

    fixed_cfg = tiny_cfg(cache_dir, "training.micro_batch_size=11", *faults)
    run_recording_steps(fixed_cfg, tmp_path / "fixed")
    a, f = read_jsonl(tmp_path / "auto/metrics.jsonl"), read_jsonl(tmp_path / "fixed/metrics.jsonl")
    for key in ("train/loss", "val/loss", "train/grad_norm"):
        got = [r[key] for r in a if key in r]
        want = [r[key] for r in f if key in r]
        assert len(got) == len(want) > 0
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    assert Summary.read(tmp_path / "auto").batch_details.probe.probe_steps > 0


# --- the cache -------------------------------------------------------------------------------


def test_same_shape_reads_the_cache_and_a_new_shape_probes_again(cache_dir, probing):
    cfg = tiny_cfg(cache_dir, "training.micro_batch_size=auto", "training.effective_batch_size=8")
    first = plan_for(cfg, probing)
    assert first.source == "probed" and probing.forwards
    probing.forwards.clear()

    again = plan_for(cfg, probing)
    assert again.source == "cached" and again.probe.probe_steps == 0
    assert not probing.forwards
    assert again.micro_batch_size == first.micro_batch_size

    for change in ("data.seq_len=16", "precision=bf16"):
        auto = ["training.micro_batch_size=auto", "training.effective_batch_size=8"]
        plan = plan_for(tiny_cfg(cache_dir, *auto, change), probing)
        assert plan.source == "probed" and probing.forwards, change
        probing.forwards.clear()
    assert len(list((cache_dir / "autobatch").glob("microbatch-*.json"))) == 3


def test_cache_off_always_probes(cache_dir):
    cfg = tiny_cfg(
        cache_dir,
        "training.micro_batch_size=auto",
        "training.auto_batch.cache=false",
        "training.effective_batch_size=8",
    )
    assert plan_for(cfg).source == "probed"
    assert plan_for(cfg).source == "probed"
    assert not (cache_dir / "autobatch").exists()


def key_of(cache_dir, model, *overrides: str) -> str:
    setup, _, _ = parts(tiny_cfg(cache_dir, *overrides))
    return batch_cache.key_hash(batch_cache.cache_key(setup, model))


def test_cache_key_holds_what_changes_memory(cache_dir):
    setup, model, _ = parts(tiny_cfg(cache_dir))
    key = batch_cache.cache_key(setup, model)
    assert {"device", "model", "seq_len", "precision", "gradient_checkpointing", "compile"} <= set(
        key
    )
    assert {"optimizer", "torch", "faults"} <= set(key)
    base = batch_cache.key_hash(key)
    changes = (
        "model.gradient_checkpointing=true",
        "faults.oom_above_micro_batch=3",
        "training.optimizer=lion",  # its own state size: its own entry
        "training.optimizer=adafactor",
    )
    keys = {change: key_of(cache_dir, model, change) for change in changes}
    # Each its own entry: not the base's, nor one another's (Lion and Adafactor alike).
    assert len({base, *keys.values()}) == len(changes) + 1, keys
    # The effective batch does not change memory per step.
    assert key_of(cache_dir, model, "training.effective_batch_size=64") == base


def test_cache_key_holds_the_parallelism_and_the_world_size(cache_dir):
    """What fits a rank depends on how the model is spread (FSDP: 1/world of the state; DDP:
    its gradient buckets): each layout and world size has its own entry."""
    from app.engine.comms.distributed import DistInfo

    setup, model, _ = parts(tiny_cfg(cache_dir))
    layouts = {
        "one process": DistInfo(),
        "ddp x2": DistInfo(rank=0, world_size=2, parallelism="ddp"),
        "ddp x4": DistInfo(rank=0, world_size=4, parallelism="ddp"),
        "fsdp x2": DistInfo(rank=0, world_size=2, parallelism="fsdp"),
    }
    keys = {}
    for name, dist in layouts.items():
        setup.machine.dist = dist
        keys[name] = batch_cache.key_hash(batch_cache.cache_key(setup, model))
    assert len(set(keys.values())) == len(layouts), keys


def test_concurrent_writers_merge_and_never_corrupt(tmp_path):
    path = tmp_path / "c" / "microbatch-x.json"
    key = {"k": 1}

    def writer(i: int) -> None:
        for j in range(10):
            batch_cache.merge_entry(path, key, {100 * i + j: trial(float(j))}, upper=64)
        batch_cache.record_oom(path, key, 1000 + i)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    entry = batch_cache.read_entry(path, key)
    assert entry is not None and len(entry["trials"]) == 44
    assert all(entry["trials"][1000 + i]["oom"] for i in range(4))
    assert not list(path.parent.glob(".*.tmp"))


def test_a_corrupt_or_foreign_cache_file_is_ignored_and_rewritten(tmp_path):
    path = tmp_path / "microbatch-x.json"
    path.write_text('{"key": {"k": 1}, "trials": {"8": ')  # a torn write from elsewhere
    assert batch_cache.read_entry(path, {"k": 1}) is None
    batch_cache.merge_entry(path, {"k": 1}, {8: trial(1.0)}, upper=8)
    assert batch_cache.read_entry(path, {"k": 2}) is None  # another shape's key
    entry = batch_cache.read_entry(path, {"k": 1})
    assert entry["trials"][8]["samples_per_sec"] == 1.0 and entry["searched_up_to"] == 8


class LinearMemory:
    """A memory meter whose peak grows 5 % of the machine per sample of the candidate being
    probed (the last training forward of the recording task)."""

    def __init__(self, task: RecordingLM) -> None:
        self.task = task

    def reset(self) -> None:
        pass

    def sync(self) -> None:
        pass

    def peak_fraction(self) -> float:
        return self.task.forwards[-1] * 0.05


def test_the_measured_peak_memory_caps_the_probe(cache_dir, probing):
    """Sizes whose measured peak is above the limit fail like an OOM does, so the probe stops
    below them: 10 fits under 0.5."""
    cfg = tiny_cfg(
        cache_dir,
        "training.micro_batch_size=auto",
        "training.auto_batch.cpu_memory_fraction=0.5",
        "training.auto_batch.throughput_aware=false",
    )
    plan = plan_for(cfg, probing, LinearMemory(probing))
    rows = {r.micro: r for r in plan.probe.candidates}
    assert rows[16].fits is False and rows[16].oom is False  # refused by memory, no OOM
    assert rows[10].fits and not rows[11].fits
    assert plan.micro_batch_size == 8  # 10 at most per micro-batch: 32 = 8 + 8 + 8 + 8


def test_the_probe_budget_refuses_what_would_pass_its_seconds_or_steps():
    """max_probe_seconds and max_probe_steps, on a clock the test moves (no wall clock)."""
    from app.engine.batch.search import ProbeAllowance

    now = [100.0]
    budget = ProbeAllowance(max_steps=10, max_seconds=5.0, clock=lambda: now[0])
    assert budget.allows(steps=4, est_seconds=4.0)
    now[0] = 102.0  # 2 s spent: 2 + 4 > 5
    assert not budget.allows(steps=1, est_seconds=4.0)
    assert budget.allows(steps=1, est_seconds=3.0)
    budget.steps = 9
    assert not budget.allows(steps=2, est_seconds=0.0)  # 11 steps > 10
    assert budget.elapsed == 2.0
