"""`training.micro_batch_size=auto`: probe the largest micro-batch that trains, pick, cache.

The probe runs the run's own code path (app/engine/train/step.py: forward, backward and the
optimizer step, with the run's precision and fault injection) plus one evaluation micro-batch
per candidate, on full-length blocks: packed blocks are all seq_len + 1 tokens, so that is the
worst case. Each candidate gets a warm-up step first (optimizer state, cudnn autotuning) and is
judged on the step after it. With torch.compile on, the candidates run eagerly and the choice is
then confirmed on the compiled module the run keeps (app/engine/batch/search.py: the run's two
graphs compiled once, its compiled memory measured, a failure backed off from and cached).

Search: 1, 2, 4, ... up to the cap, then a binary search between the last fit and the first
failure. A candidate fails on an OOM or when its peak memory leaves less free than the safety
margin: on CUDA the peak reserved memory (plus what other processes use) over the device total,
`gpu.memory_headroom` kept free; on CPU the process's peak RSS over system memory, at most
`training.auto_batch.cpu_memory_fraction` used, candidates capped at `cpu_max_micro_batch`.
The probe stops after `max_probe_steps` steps or `max_probe_seconds` and keeps the best known fit.

Choice: with `throughput_aware`, the fitting sizes in the top half are timed (the split sizes
this effective batch really uses) and the fastest in samples/s wins; near-ties go to the larger
(eager speeds, compiled or not: the compiled confirmation's speed is not compared).
The micro-batch is then trimmed to the largest size of its split: 32 samples at most 12 per
micro-batch run as 11+11+10, so the plan says 11.

Cache (app/engine/batch/cache.py): one JSON file per shape under `<data.cache_dir>/autobatch/` (or
`training.auto_batch.cache_dir`), keyed by everything that changes memory
use (FSDP's shards too: parallelism and world size). Writers take a file lock and merge, and
write atomically, so parallel HPO workers neither
corrupt nor lose entries. Failures are sticky: an OOM learned during a run (`record_oom`) caps
every later run of that shape.

The model, its RNG and its gradients are restored after the probe, and the probe's optimizer is
thrown away, so the run trains exactly as it would with the chosen micro-batch fixed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path

import torch

from app.components.models.compiling import compiles
from app.components.tasks.base import TaskData
from app.engine.batch.cache import (
    ProbeSetup,
    Trials,
    cache_key,
    cache_path,
    covers,
    fits_below_failure,
    merge_entry,
    read_entry,
    record_oom,
)
from app.engine.batch.choice import Chooser, agree_across_ranks, candidate_rows, memory_limit
from app.engine.batch.memory import MemoryMeter
from app.engine.batch.search import Probe, ProbeCost
from app.engine.batch_plan import BatchPlan, fixed_plan
from app.engine.comms.distributed import DistInfo, agree_all
from app.engine.parallel.wrap import compiled_forward
from app.engine.records.batch import ProbeReport

log = logging.getLogger(__name__)


def auto_plan(
    setup: ProbeSetup,
    model: torch.nn.Module,
    data: TaskData,
    meter: MemoryMeter | None = None,
    compiled: torch.nn.Module | None = None,
) -> BatchPlan:
    """The plan for micro_batch_size=auto: from the cache when it answers, else probed (with
    `meter`, the memory reading; a test gives its own). With compile on, `compiled` is the
    module the run will train, whose graphs the probe compiles for it (None: made here)."""
    dist, device = setup.machine.dist, setup.machine.device
    t, ab = setup.training, setup.training.auto_batch
    fixed_plan(t.effective_batch_size, 1, dist.world_size, dist.rank)  # validates
    # The largest share, the same on every rank: ranks probe and pick alike.
    per_rank = math.ceil(t.effective_batch_size / dist.world_size)
    cap = ab.cpu_max_micro_batch if device.type == "cpu" else ab.max_micro_batch
    upper = max(1, min(per_rank, cap))
    # The noise scale compares two micro-batch sizes: at least two a step. Probed to the whole
    # share still, so the throughput found for this batch does not depend on it.
    largest = max(1, min(upper, per_rank // 2)) if t.measures_noise else upper
    # An adaptive batch is probed up to its largest share: the micro-batch grows with it
    reach = max(upper, min(math.ceil(t.batch_cap / dist.world_size), cap))
    limit = memory_limit(device, setup.machine.preset, ab)
    chooser = Chooser(limit, largest, per_rank, ab.throughput_aware, dist, device.torch_device)
    key = cache_key(setup, model)
    path = cache_path(setup.cache_dir, key) if setup.cache_dir is not None else None
    entry = read_entry(path, key) if path else None
    hit = entry is not None and covers(entry, reach, limit)
    hit = agree_all(hit, dist)  # the ranks probe together: all use the cache, or none
    if hit and entry is not None:
        trials, source, cost = entry["trials"], "cached", ProbeCost()
    else:
        probe = Probe(setup, model, data, limit, meter, to_confirm(setup, model, compiled))
        trials = probe.run(reach, per_rank, ab.throughput_aware, chooser.pick)
        source, cost = "probed", probe.cost()
        if path is not None and dist.is_main:
            merge_entry(path, key, trials, reach)
    micro, chosen_by = chooser.choose(trials)
    grows = t.batch_cap > t.effective_batch_size
    ceiling = growth_ceiling(trials, limit, reach, dist, device.torch_device) if grows else None
    report = probe_report(cost, chosen_by, limit, trials, path)
    plan = BatchPlan(
        t.effective_batch_size, micro, dist.world_size, dist.rank, source, report,
        micro_ceiling=ceiling,
    )  # fmt: skip
    log.info("auto micro-batch: %s", plan.describe())
    return plan


def to_confirm(
    setup: ProbeSetup, model: torch.nn.Module, compiled: torch.nn.Module | None
) -> torch.nn.Module | None:
    """The compiled module the probe confirms its choice on (None: the run does not compile)."""
    if not compiles(setup.model, setup.machine.preset):
        return None
    return compiled_forward(model, setup.model, setup.machine) if compiled is None else compiled


def probe_report(
    cost: ProbeCost, chosen_by: str, limit: float, trials: Trials, path: Path | None
) -> ProbeReport:
    confirmed = cost.confirmation
    return ProbeReport(
        probe_seconds=cost.seconds,
        probe_steps=cost.steps,
        chosen_by=chosen_by,
        memory_limit_fraction=limit,
        candidates=candidate_rows(trials, limit),
        cache=str(path) if path else None,
        confirm_seconds=None if confirmed is None else confirmed.seconds,
        graphs_compiled=None if confirmed is None else confirmed.graphs,
    )


def growth_ceiling(
    trials: Trials, limit: float, reach: int, dist: DistInfo, device: torch.device
) -> int:
    """The largest micro-batch an adaptive batch may grow to: the largest that fits below the
    first failure, the same on every rank (the tightest device's)."""
    fits, _ = fits_below_failure(trials, limit, reach)
    return agree_across_ranks(fits[-1], dist, device)


def oom_listener(setup: ProbeSetup, model: torch.nn.Module) -> Callable[[BatchPlan], None] | None:
    """A Run.on_plan_change callback that teaches the cache the micro-batch that ran out."""
    if setup.cache_dir is None:
        return None
    key = cache_key(setup, model)
    path = cache_path(setup.cache_dir, key)

    def learn(plan: BatchPlan) -> None:
        failed = plan.ooms.reduced_from
        if failed is not None:
            record_oom(path, key, failed)

    return learn


def describe(plan: BatchPlan) -> str | None:
    """One banner line: how the micro-batch was chosen, with the figures."""
    d = plan.probe
    if d is None:
        return None
    rows = d.candidates
    fits = ",".join(str(r.micro) for r in rows if r.fits)
    fails = ",".join(str(r.micro) for r in rows if not r.fits)
    speed = " ".join(f"{r.micro}:{r.samples_per_sec:.0f}" for r in rows if r.samples_per_sec)
    peaks = [p for r in rows if r.fits and (p := r.peak_fraction) is not None]
    peak = f"{max(peaks):.2f}" if peaks else "?"
    compiled = ""
    if d.confirm_seconds is not None:
        compiled = (
            f"; confirmed compiled in {d.confirm_seconds:.1f}s "
            f"({d.graphs_compiled} graphs, kept for the run)"
        )
    return (
        f"{plan.source} in {d.probe_seconds:.1f}s / {d.probe_steps} steps; "
        f"fit [{fits}] failed [{fails}]; samples/s {speed or '-'}; peak memory {peak} "
        f"(limit {d.memory_limit_fraction:.2f}); chosen by {d.chosen_by}{compiled}"
    )


def plan_scalars(plan: BatchPlan) -> dict[str, float]:
    """TensorBoard figures of the batch plan (the text goes to run/plan)."""
    d = plan.probe
    out = {
        "batch/micro_batch_size": float(plan.micro_batch_size),
        "batch/grad_accum_steps": float(plan.grad_accum_steps),
        "batch/probed": float(plan.source == "probed"),
        "batch/cached": float(plan.source == "cached"),
    }
    if d is not None:
        out["batch/probe_seconds"] = d.probe_seconds
        out["batch/probe_steps"] = float(d.probe_steps)
        out["batch/candidates"] = float(len(d.candidates))
        if d.confirm_seconds is not None:
            out["batch/confirm_seconds"] = d.confirm_seconds
    return out
