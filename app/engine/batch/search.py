"""The probe itself: train the run's own step on worst-case samples at growing micro-batches.

1, 2, 4, ... up to the cap, then a binary search between the last fit and the first failure;
each candidate gets a warm-up step first (optimizer state, cudnn autotuning) and is judged on
the step after it, plus one evaluation micro-batch. The probe stops after `max_probe_steps`
steps or `max_probe_seconds`. The model, its RNG and its gradients are restored afterwards, and
the probe's optimizer is thrown away, so the run trains exactly as it would with the chosen
micro-batch fixed.

With torch.compile on, the search runs eagerly (a graph per size tried would cost more than the
search itself), and the chosen size is then confirmed once on the compiled module the run keeps
(`Probe.confirm`): that compiles the run's training and evaluation graphs, which the run reuses
(no reset: its first step compiles nothing), and measures the compiled step's memory, its
first-step peak included. A confirmation that runs out of memory or over the limit is recorded
like any candidate (and cached, so it sticks) and the next choice below it is confirmed in its
place, on the same graphs: their batch dimension is dynamic (app/components/models/compiling.py).

Under torchrun every rank probes at its own real memory and the ranks agree on each candidate's
outcome (an OOM on any rank fails it, the highest peak and the lowest speed count) and on the
budget, so they try the same sizes in the same order and cache the worst rank's results. Under
DDP the probe trains the model without its DDP wrapper (no collective in a step); under FSDP it
trains the sharded model, whose steps are collectives, with the OOM agreement at each phase
boundary (app/engine/comms/agreement.py); its blocks, compiled in place, run eagerly in the
search.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from app.components.models.compiling import eager, graphs_compiled
from app.components.optim import OPTIMIZERS
from app.components.schedule import build_scheduler
from app.components.tasks.base import TaskData, move
from app.engine.batch.cache import ProbeSetup, Trial, Trials, failed, fits_below_failure
from app.engine.batch.choice import split_candidates
from app.engine.batch.memory import MemoryMeter
from app.engine.batch_plan import EVAL_FACTOR, BatchPlan
from app.engine.comms.agreement import AgreedOOM, Agreement
from app.engine.comms.distributed import DistInfo, agree_all, host_buffer, without_autograd
from app.engine.faults import FaultInjector
from app.engine.run import Run
from app.engine.saving import checkpoint as ckpt
from app.engine.train.evaluation import eval_sums
from app.engine.train.recovery import release_after_oom
from app.engine.train.step import train_step

log = logging.getLogger(__name__)


class ProbeAllowance:
    """The probe's allowance: max_probe_steps steps and max_probe_seconds on `clock`."""

    def __init__(
        self, max_steps: int, max_seconds: float, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.max_steps = max_steps
        self.max_seconds = max_seconds
        self.clock = clock
        self.started = clock()
        self.steps = 0

    @property
    def elapsed(self) -> float:
        return self.clock() - self.started

    def allows(self, steps: int, est_seconds: float) -> bool:
        return (
            self.steps + steps <= self.max_steps and self.elapsed + est_seconds <= self.max_seconds
        )


@dataclass(frozen=True)
class Confirmation:
    """The compiled confirmation: its seconds (mostly compiling the run's graphs, which its first
    step would pay otherwise), the graphs it compiled, the size it confirmed (None: none fit)."""

    seconds: float
    graphs: int
    micro: int | None


@dataclass(frozen=True)
class ProbeCost:
    """What probing took: the search's seconds, every probe step (the confirmation's too), and
    the compiled confirmation (None: the run does not compile, or the plan was cached)."""

    seconds: float = 0.0
    steps: int = 0
    confirmation: Confirmation | None = None


Pick = Callable[[Trials], int | None]  # the size chosen from these trials (None: none fits)


class Probe:
    def __init__(
        self,
        setup: ProbeSetup,
        model: torch.nn.Module,
        data: TaskData,
        limit: float,
        meter: MemoryMeter | None = None,
        compiled: torch.nn.Module | None = None,
    ) -> None:
        """`compiled`: the compiled module the run will train (FSDP: the model, its blocks
        compiled), confirmed at the chosen size; None: the run does not compile."""
        ab = setup.training.auto_batch
        self.setup, self.model, self.data = setup, model, data
        self.device, self.limit = setup.machine.device, limit
        self.budget = ProbeAllowance(ab.max_probe_steps, ab.max_probe_seconds)
        self.trials: Trials = {}
        self.last: tuple[int, float] | None = None  # (micro, seconds) of the last candidate
        self.meter = MemoryMeter(setup.machine.device) if meter is None else meter
        self.compiled = compiled
        self.searched: float | None = None  # the search's seconds
        self.confirmation: Confirmation | None = None

    def cost(self) -> ProbeCost:
        searched = self.budget.elapsed if self.searched is None else self.searched
        return ProbeCost(searched, self.budget.steps, self.confirmation)

    def run(self, upper: int, per_rank: int, throughput_aware: bool, pick: Pick) -> Trials:
        """Search eagerly; with `compiled`, confirm `pick`'s choice on it."""
        with preserved(self.model, self.device.torch_device):
            self.probe_run = self._probe_run()
            try:
                with eager():  # every size uncompiled: no graph per size tried
                    self.search(upper)
                    if throughput_aware:
                        # The split sizes of this batch's share (an adaptive batch searched beyond)
                        self.time_top(per_rank, min(upper, per_rank))
                self.searched = self.budget.elapsed
                if self.compiled is not None:
                    self.confirm(self.compiled, pick)
            finally:
                del self.probe_run
        log.info("batch probe: %d steps in %.1fs", self.budget.steps, self.budget.elapsed)
        return self.trials

    def confirm(self, compiled: torch.nn.Module, pick: Pick) -> None:
        """The chosen size once more, on the compiled module: two training steps and an
        evaluation micro-batch, which compile the run's two graphs and measure the compiled
        step's memory (its first-step peak too). Its speed is left out: the choice compares
        eager speeds. A size that fails is recorded like any and the next choice confirmed."""
        self.probe_run.model = compiled
        graphs, started, micro = graphs_compiled(), time.perf_counter(), None
        try:
            while (micro := pick(self.trials)) is not None:
                trial = self._record(micro, warmup=1, timed=1, speed=False)
                if not failed(trial, self.limit):
                    break
                log.info("batch probe: micro-batch %d failed once compiled: %s", micro, trial)
        finally:
            seconds = time.perf_counter() - started
            self.confirmation = Confirmation(seconds, graphs_compiled() - graphs, micro)
        log.info("batch probe: confirmed compiled in %.1fs: micro-batch %s", seconds, micro)

    @property
    def lockstep(self) -> bool:
        """Under torchrun the ranks agree on each candidate and on the budget."""
        return self.setup.machine.dist.enabled

    def _probe_run(self) -> Run:
        s, tdev, precision = self.setup, self.device.torch_device, self.setup.machine.precision
        optimizer = OPTIMIZERS.get(s.training.optimizer).create(self.model, s.training)
        dist = s.machine.dist
        return Run(
            # The search's, uncompiled (FSDP: the sharded model; DDP: the model on its own).
            model=self.model,
            raw_model=self.model,
            optimizer=optimizer,
            scheduler=build_scheduler(optimizer, s.budget),
            plan=BatchPlan(1, 1),
            precision=precision,
            device=tdev,
            cfg=s.training,
            steps=iter(()),
            val_blocks=self.data.val[:1],
            run_dir=Path("."),
            task=s.task,
            budget=s.budget,
            scaler=torch.amp.GradScaler(tdev.type) if precision.use_grad_scaler else None,
            faults=FaultInjector(s.faults, dist.rank),
            dist=dist if dist.sharded else DistInfo(),
            # FSDP's steps are collectives: the ranks agree on OOMs at each phase boundary.
            agreement=Agreement(dist.rank, dist.sharded and dist.enabled, dist.host_group),
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

    def measure(self, micro: int, warmup: int, timed: int) -> Trial | None:
        steps = warmup + timed
        allowed = self.budget.allows(steps, self._estimate(micro, steps)) or not self.trials
        if not (agree_all(allowed, self.setup.machine.dist) if self.lockstep else allowed):
            return None
        started = time.perf_counter()
        trial = self._record(micro, warmup, timed)
        self.last = (micro, (time.perf_counter() - started) / steps)
        log.debug("probe micro-batch %d: %s", micro, trial)
        return trial

    def _record(self, micro: int, warmup: int, timed: int, speed: bool = True) -> Trial:
        """Probe steps at `micro` (the ranks' figures agreed), added to what is known of it;
        without `speed` its samples/s is left out (the choice compares eager speeds)."""
        trial = self._steps(micro, warmup, timed)
        if self.lockstep:
            trial = agreed_trial(trial, self.setup.machine.dist)
        if not speed:
            trial.pop("samples_per_sec", None)
        self.trials[micro] = {**self.trials.get(micro, {}), **trial}  # a figure unknown: left out
        return self.trials[micro]

    def eval_size(self, micro: int) -> int:
        """The evaluation micro-batch a training size must leave room for. An explicit size is
        the user's: not probed here (its OOM halves evaluation only, never the training size)."""
        if not self.setup.training.eval_micro_batch.scaled:
            return micro
        return EVAL_FACTOR * micro

    def _estimate(self, micro: int, steps: int) -> float:
        if self.last is None:
            return 0.0
        last_micro, per_step = self.last
        return per_step * steps * max(1.0, micro / last_micro)

    def _steps(self, micro: int, warmup: int, timed: int) -> Trial:
        run = self.probe_run
        run.plan = BatchPlan(micro, micro)
        batch = run.task.worst_case(self.data.train, micro)
        self.meter.reset()
        fastest, error, alone = math.inf, None, False
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
            error, alone = str(exc).splitlines()[0], not isinstance(exc, AgreedOOM)
        if error is not None:
            # Outside the except block: the traceback no longer pins the failed step's tensors.
            if alone:
                run.agreement.join(0)
            release_after_oom(run, batch)
            return {"oom": True, "error": error}
        return known_figures(
            self.meter.peak_fraction(), micro / fastest if 0 < fastest < math.inf else None
        )


def known_figures(peak: float | None, speed: float | None) -> Trial:
    """A candidate that fit, with the figures that were measured (an unknown one is left out,
    so it never replaces a figure measured before)."""
    trial: Trial = {"oom": False}
    if peak is not None:
        trial["peak_fraction"] = peak
    if speed is not None:
        trial["samples_per_sec"] = speed
    return trial


def agreed_trial(trial: Trial, dist: DistInfo) -> Trial:
    """One candidate's outcome as every rank records it: an OOM on any rank, the highest
    peak, the lowest speed (the ranks step together, at the slowest one's pace)."""
    import torch.distributed as tdist

    peak, speed = trial.get("peak_fraction"), trial.get("samples_per_sec")
    flags = host_buffer(
        "probe_trial",
        [float(trial["oom"]), -1.0 if peak is None else peak, 1.0 if speed is None else -speed],
        torch.float64,
    )
    tdist.all_reduce(flags, op=tdist.ReduceOp.MAX, group=dist.host_group)
    oom, peak, speed = flags.tolist()
    if oom:
        return {"oom": True, "error": trial.get("error") or "out of memory on another rank"}
    return known_figures(None if peak < 0 else peak, None if speed > 0 else -speed)


@without_autograd
def eval_micro_batch(run: Run, batch: object) -> None:
    """One evaluation forward of `batch`, a step batch of the run's task."""
    run.model.eval()
    try:
        x, y = run.task.inputs_and_targets(batch)
        run.agreement.boundary(run.faults, "eval", len(y), 0)
        eval_sums(run, move(x, run.device), y.to(run.device), run.model)
        run.agreement.settle(0, "evaluated")
    finally:
        run.model.train()


@contextlib.contextmanager
def preserved(model: torch.nn.Module, device: torch.device) -> Iterator[None]:
    """Leave the model, its gradients and the RNG as they were before the probe."""
    # On the host: a device copy would count against the very memory being probed. Of a
    # sharded (FSDP) model, this rank's shards, copied back in place.
    state = {k: _local(v).detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    rng = ckpt.rng_state()
    was_training = model.training
    try:
        yield
    finally:
        with torch.no_grad():
            for k, v in model.state_dict().items():
                _local(v).copy_(state[k])
        model.zero_grad(set_to_none=True)
        model.train(was_training)
        ckpt.set_rng_state(rng)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)  # the run's peak is the run's


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t
