"""`training.micro_batch_size=auto`: probe the largest micro-batch that trains, pick, cache.

The probe runs the run's own code path (app.engine.loop.train_step: forward, backward and the optimizer
step, with the run's precision, compile setting and fault injection) plus one evaluation
micro-batch per candidate, on full-length blocks: packed blocks are all seq_len + 1 tokens, so
that is the worst case. Each candidate gets a warm-up step first (optimizer state, cudnn
autotuning, compilation) and is judged on the step after it.

Search: 1, 2, 4, ... up to the cap, then a binary search between the last fit and the first
failure. A candidate fails on an OOM or when its peak memory leaves less free than the safety
margin: on CUDA the peak reserved memory (plus what other processes use) over the device total,
`gpu.memory_headroom` kept free; on CPU the process's peak RSS over system memory, at most
`training.auto_batch.cpu_memory_fraction` used, candidates capped at `cpu_max_micro_batch`.
The probe stops after `max_probe_steps` steps or `max_probe_seconds` and keeps the best known fit.

Choice: with `throughput_aware`, the fitting sizes in the top half are timed (the split sizes
this effective batch really uses) and the fastest in samples/s wins; near-ties go to the larger.
The micro-batch is then trimmed to the largest size of its split: 32 samples at most 12 per
micro-batch run as 11+11+10, so the plan says 11.

Cache (app/batch/cache.py): one JSON file per shape under `<data.cache_dir>/autobatch/` (or
`training.auto_batch.cache_dir`), keyed by everything that changes memory
use. Writers take a file lock and merge, and write atomically, so parallel HPO workers neither
corrupt nor lose entries. Failures are sticky: an OOM learned during a run (`record_oom`) caps
every later run of that shape.

The model, its RNG and its gradients are restored after the probe, and the probe's optimizer is
thrown away, so the run trains exactly as it would with the chosen micro-batch fixed.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import resource
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from app.engine import checkpoint as ckpt
from app.engine.batch.cache import (
    Trials,
    cache_key,
    cache_path,
    covers,
    failed,
    fits_below_failure,
    merge_entry,
    read_entry,
    record_oom,
)
from app.engine.batch.faults import FaultInjector
from app.engine.batch.plan import BatchPlan, eval_micro_size, fixed_plan
from app.engine.context import RunContext
from app.engine.distributed import DistInfo
from app.components.hardware.devices import DeviceInfo
from app.components.hardware.memory import host_memory_bytes
from app.engine.loop import Run, eval_sums, release_after_oom, train_step
from app.components.models.build import maybe_compile
from app.components.optim.adamw import build_optimizer, build_scheduler
from app.core.outcomes import TrainingOOM
from app.components.tasks.base import TaskData, move

log = logging.getLogger(__name__)
TIE = 0.03  # samples/s within 3% count as a tie (timing noise): the larger micro-batch wins
TIMED_SIZES = 3  # split sizes timed near the top


# ---------------------------------------------------------------------------------------------
# Entry points


def auto_plan(ctx: RunContext, model: torch.nn.Module, data: TaskData) -> BatchPlan:
    cfg, dist, device = ctx.cfg, ctx.dist, ctx.device
    t, ab = cfg.training, cfg.training.auto_batch
    base = fixed_plan(t.effective_batch_size, 1, dist.world_size, dist.rank)  # validates
    per_rank = base.per_rank_batch
    cap = ab.cpu_max_micro_batch if device.type == "cpu" else ab.max_micro_batch
    upper = max(1, min(per_rank, cap))
    limit = memory_limit(device, ctx.preset, ab)
    key = cache_key(ctx, model)
    path = cache_path(cfg, key) if ab.cache else None
    entry = read_entry(path, key) if path else None
    if entry is not None and covers(entry, upper, limit):
        trials, source, stats = entry["trials"], "cached", {"probe_seconds": 0.0, "probe_steps": 0}
    else:
        probe = Probe(ctx, model, data, limit)
        trials = probe.run(upper, per_rank, throughput_aware=ab.throughput_aware)
        source, stats = "probed", probe.stats()
        if path is not None and dist.is_main:
            merge_entry(path, key, trials, upper)
    micro, chosen_by = choose(trials, limit, upper, per_rank, ab.throughput_aware)
    micro = agree_across_ranks(micro, dist, device.torch_device)
    details = {
        **stats,
        "chosen_by": chosen_by,
        "memory_limit_fraction": limit,
        "candidates": candidate_rows(trials, limit),
        "cache": str(path) if path else None,
    }
    plan = BatchPlan(t.effective_batch_size, micro, dist.world_size, dist.rank, source, details)
    log.info("auto micro-batch: %s", plan.describe())
    return plan


def oom_listener(ctx: RunContext, model: torch.nn.Module) -> Callable[[BatchPlan], None] | None:
    """A Run.on_plan_change callback that teaches the cache the micro-batch that ran out."""
    if not ctx.cfg.training.auto_batch.cache:
        return None
    key = cache_key(ctx, model)
    path = cache_path(ctx.cfg, key)

    def learn(plan: BatchPlan) -> None:
        failed = plan.details.get("reduced_from")
        if failed is not None:
            record_oom(path, key, int(failed))

    return learn


def describe(plan: BatchPlan) -> str | None:
    """One banner line: how the micro-batch was chosen, with the figures."""
    d = plan.details
    if "candidates" not in d:
        return None
    rows = d["candidates"]
    fits = ",".join(str(r["micro"]) for r in rows if r["fits"])
    fails = ",".join(str(r["micro"]) for r in rows if not r["fits"])
    speed = " ".join(
        f"{r['micro']}:{r['samples_per_sec']:.0f}" for r in rows if r.get("samples_per_sec")
    )
    peaks = [r["peak_fraction"] for r in rows if r["fits"] and r.get("peak_fraction") is not None]
    peak = f"{max(peaks):.2f}" if peaks else "?"
    return (
        f"{plan.source} in {d['probe_seconds']:.1f}s / {d['probe_steps']} steps; "
        f"fit [{fits}] failed [{fails}]; samples/s {speed or '-'}; peak memory {peak} "
        f"(limit {d['memory_limit_fraction']:.2f}); chosen by {d['chosen_by']}"
    )


def plan_scalars(plan: BatchPlan) -> dict[str, float]:
    """TensorBoard figures of the batch plan (the text goes to run/plan)."""
    d = plan.details
    out = {
        "batch/micro_batch_size": float(plan.micro_batch_size),
        "batch/grad_accum_steps": float(plan.grad_accum_steps),
        "batch/probed": float(plan.source == "probed"),
        "batch/cached": float(plan.source == "cached"),
    }
    for name in ("probe_seconds", "probe_steps"):
        if name in d:
            out[f"batch/{name}"] = float(d[name])
    if "candidates" in d:
        out["batch/candidates"] = float(len(d["candidates"]))
    return out


# ---------------------------------------------------------------------------------------------
# Choice (pure: the same rules for fresh probe results and cached ones)


def memory_limit(device: DeviceInfo, preset: DictConfig, ab: DictConfig) -> float:
    """Largest fraction of device (CPU: system) memory a candidate's peak may use."""
    if device.type == "cpu":
        return float(ab.cpu_memory_fraction)
    return 1.0 - float(preset.memory_headroom)


def fit_split(per_rank: int, micro: int) -> int:
    """The largest micro-batch of the split `micro` gives: 32 at most 12 -> 11+11+10 -> 11."""
    return math.ceil(per_rank / math.ceil(per_rank / micro))


def split_candidates(per_rank: int, top: int) -> list[int]:
    """Distinct split sizes at most `top` and at least top/2, largest first."""
    sizes: list[int] = []
    count = math.ceil(per_rank / top)
    while len(sizes) < TIMED_SIZES and count <= per_rank:
        size = math.ceil(per_rank / count)
        if 2 * size < top:
            break
        if size not in sizes:
            sizes.append(size)
        count += 1
    return sizes


def choose(
    trials: Trials, limit: float, upper: int, per_rank: int, throughput_aware: bool
) -> tuple[int, str]:
    """(micro-batch, how it was chosen); raises TrainingOOM when not even 1 fits."""
    fits, first_fail = fits_below_failure(trials, limit, upper)
    if not fits:
        raise TrainingOOM(
            f"micro-batch 1 does not fit in memory (first failure at {first_fail}); "
            "use a smaller model, data.seq_len, gradient checkpointing or lower precision"
        )
    top = fits[-1]
    if not throughput_aware:
        return fit_split(per_rank, top), "largest"
    timed = {
        m: trials[m]["samples_per_sec"]
        for m in fits
        if 2 * m >= top and trials[m].get("samples_per_sec")
    }
    if len(timed) < 2:
        return fit_split(per_rank, top), "largest"
    best = max(timed.values())
    pick = max(m for m, sps in timed.items() if sps >= best * (1 - TIE))
    return fit_split(per_rank, pick), "throughput"


def candidate_rows(trials: Trials, limit: float) -> list[dict[str, Any]]:
    fits, _ = fits_below_failure(trials, limit, max(trials, default=0))
    return [
        {
            "micro": m,
            "fits": m in fits,
            "oom": bool(t.get("oom")),
            "peak_fraction": t.get("peak_fraction"),
            "samples_per_sec": t.get("samples_per_sec"),
        }
        for m, t in sorted(trials.items())
    ]


def agree_across_ranks(micro: int, dist: DistInfo, device: torch.device) -> int:
    # Ranks probe their own device; every rank must use the size the tightest one can afford.
    if not dist.enabled:
        return micro
    import torch.distributed as tdist

    value = torch.tensor(micro, device=device)
    tdist.all_reduce(value, op=tdist.ReduceOp.MIN)
    return int(value)


# ---------------------------------------------------------------------------------------------
# The probe


class Budget:
    def __init__(self, max_steps: int, max_seconds: float) -> None:
        self.max_steps = max_steps
        self.max_seconds = max_seconds
        self.started = time.perf_counter()
        self.steps = 0

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def allows(self, steps: int, est_seconds: float) -> bool:
        return (
            self.steps + steps <= self.max_steps and self.elapsed + est_seconds <= self.max_seconds
        )


class Probe:
    def __init__(
        self, ctx: RunContext, model: torch.nn.Module, data: TaskData, limit: float
    ) -> None:
        ab = ctx.cfg.training.auto_batch
        self.ctx, self.cfg, self.model, self.data = ctx, ctx.cfg, model, data
        self.device, self.limit = ctx.device, limit
        self.budget = Budget(ab.max_probe_steps, ab.max_probe_seconds)
        self.trials: Trials = {}
        self.last: tuple[int, float] | None = None  # (micro, seconds) of the last candidate
        self.meter = MemoryMeter(ctx.device)

    def stats(self) -> dict[str, Any]:
        return {"probe_seconds": self.budget.elapsed, "probe_steps": self.budget.steps}

    def run(self, upper: int, per_rank: int, throughput_aware: bool) -> Trials:
        with preserved(self.model, self.device.torch_device):
            self.probe_run = self._probe_run()
            try:
                self.search(upper)
                if throughput_aware:
                    self.time_top(per_rank, upper)
            finally:
                compiled = self.probe_run.model is not self.model
                del self.probe_run
                if compiled:
                    # Drop the probe's graphs: the many shapes it tried would otherwise leave the
                    # run dynamic-shape graphs or past dynamo's recompile limit (eager fallback).
                    torch._dynamo.reset()
        log.info("batch probe: %d steps in %.1fs", self.budget.steps, self.budget.elapsed)
        return self.trials

    def _probe_run(self) -> Run:
        cfg, tdev, precision = self.cfg, self.device.torch_device, self.ctx.precision
        optimizer = build_optimizer(self.model, cfg.training)
        return Run(
            model=maybe_compile(self.model, cfg.model, self.ctx.preset),
            raw_model=self.model,
            optimizer=optimizer,
            scheduler=build_scheduler(optimizer, cfg.training),
            plan=BatchPlan(1, 1),
            precision=precision,
            device=tdev,
            cfg=cfg.training,
            steps=iter(()),
            val_blocks=self.data.val[:1],
            run_dir=Path("."),
            task=self.ctx.task,
            scaler=torch.amp.GradScaler(tdev.type) if precision.use_grad_scaler else None,
            faults=FaultInjector(cfg.faults),
        )

    def search(self, upper: int) -> None:
        """Double until a failure or the cap, then bisect between last fit and first failure."""
        fit, fail, micro = 0, None, 1
        while True:
            ok = self.try_candidate(micro)
            if ok is None:
                return
            if not ok:
                fail = micro
                break
            fit = micro
            if micro >= upper:
                return
            micro = min(2 * micro, upper)
        while fail - fit > 1:
            mid = (fit + fail) // 2
            ok = self.try_candidate(mid)
            if ok is None:
                return
            fit, fail = (mid, fail) if ok else (fit, mid)

    def time_top(self, per_rank: int, upper: int) -> None:
        fits, _ = fits_below_failure(self.trials, self.limit, upper)
        if not fits:
            return
        sizes = split_candidates(per_rank, fits[-1])
        if len(sizes) < 2:
            return
        for size in sizes:
            warm = size in self.trials  # already compiled/autotuned for this shape
            if self.measure(size, warmup=0 if warm else 1, timed=2) is None:
                return

    def try_candidate(self, micro: int) -> bool | None:
        """True: fits; False: OOM or over the memory limit; None: the budget is spent."""
        trial = self.measure(micro, warmup=1, timed=1)
        return None if trial is None else not failed(trial, self.limit)

    def measure(self, micro: int, warmup: int, timed: int) -> dict[str, Any] | None:
        steps = warmup + timed
        if not (self.budget.allows(steps, self._estimate(micro, steps)) or not self.trials):
            return None
        started = time.perf_counter()
        trial = self._steps(micro, warmup, timed)
        self.last = (micro, (time.perf_counter() - started) / steps)
        old = self.trials.get(micro, {})
        self.trials[micro] = {**old, **{k: v for k, v in trial.items() if v is not None}}
        log.debug("probe micro-batch %d: %s", micro, trial)
        return self.trials[micro]

    def eval_size(self, micro: int) -> int:
        """The evaluation micro-batch a training size must leave room for. An explicit size is
        the user's: not probed here (its OOM halves evaluation only, never the training size)."""
        setting = self.cfg.training.eval_micro_batch_size
        return eval_micro_size(setting, micro) if setting == "auto" else micro

    def _estimate(self, micro: int, steps: int) -> float:
        if self.last is None:
            return 0.0
        last_micro, per_step = self.last
        return per_step * steps * max(1.0, micro / last_micro)

    def _steps(self, micro: int, warmup: int, timed: int) -> dict[str, Any]:
        run = self.probe_run
        run.plan = BatchPlan(micro, micro)
        batch = run.task.worst_case(self.data.train, micro)
        self.meter.reset()
        fastest, error = math.inf, None
        try:
            for i in range(warmup + timed):
                t0 = time.perf_counter()
                self.budget.steps += 1
                train_step(run, batch, 0)  # step 0: faults honour oom_from_step like the run
                self.meter.sync()
                if i >= warmup:
                    # The fastest step, not the mean: on a shared machine preemption only adds.
                    fastest = min(fastest, time.perf_counter() - t0)
            eval_micro_batch(run, run.task.worst_case(self.data.val, self.eval_size(micro)))
        except torch.OutOfMemoryError as exc:
            error = str(exc).splitlines()[0]
        if error is not None:
            # Outside the except block: the traceback no longer pins the failed step's tensors.
            release_after_oom(run)
            return {"oom": True, "error": error}
        return {
            "oom": False,
            "peak_fraction": self.meter.peak_fraction(),
            "samples_per_sec": micro / fastest if 0 < fastest < math.inf else None,
        }


@torch.inference_mode()
def eval_micro_batch(run: Run, batch: Any) -> None:
    run.model.eval()
    try:
        x, y = run.task.inputs_and_targets(batch)
        run.faults.check("eval", len(y), 0)
        eval_sums(run, move(x, run.device), y.to(run.device), run.model)
    finally:
        run.model.train()


@contextlib.contextmanager
def preserved(model: torch.nn.Module, device: torch.device) -> Iterator[None]:
    """Leave the model, its gradients and the RNG as they were before the probe."""
    # On the host: a device copy would count against the very memory being probed.
    state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    rng = ckpt.rng_state()
    was_training = model.training
    try:
        yield
    finally:
        model.load_state_dict(state)
        model.zero_grad(set_to_none=True)
        model.train(was_training)
        ckpt.set_rng_state(rng)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)  # the run's peak is the run's


class MemoryMeter:
    """Peak memory of one candidate as a fraction of the device's (CPU: the system's) total."""

    def __init__(self, device: DeviceInfo) -> None:
        self.device = device.torch_device
        if self.device.type == "cuda":
            free, self.total = torch.cuda.mem_get_info(self.device)
            # Memory other processes (and other allocators) hold counts against the margin too.
            self.elsewhere = self.total - free - torch.cuda.memory_reserved(self.device)
        else:
            self.total = host_memory_bytes()
            self.elsewhere = 0

    def reset(self) -> None:
        if self.device.type == "cuda":
            gc.collect()  # so the cached blocks of dead tensors can be returned
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            reset_host_peak()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def peak_fraction(self) -> float:
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_reserved(self.device)
        else:
            peak = host_peak_bytes()
        return (self.elsewhere + peak) / self.total


def reset_host_peak() -> None:
    # Linux: writing 5 resets this process's peak RSS (VmHWM); elsewhere it stays cumulative.
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def host_peak_bytes() -> int:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
