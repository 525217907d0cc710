"""A trial on several GPUs: one run as `hpo.gpus_per_trial` ranks, started from the sweep
worker's process through torch's own launcher API (`torch.distributed.launcher.api`, what
torchrun runs), with DDP as under torchrun.

One place owns the trial: rank 0 reports to it (the others get a reporter that does nothing),
and its decision (prune, or pause at an asha rung) reaches every rank at the evaluation where
it is taken (app/engine/train/evaluation.py), as a stop signal does after each step
(app/engine/train/loop.py): all ranks stop after the same step, and on a pause each saves its part
of the checkpoint that the trial's promotion resumes on every rank. Every rank trains the
config the worker composed for the trial, pickled to it: the same sampled parameters by
construction.

Each rank writes how it ended to <run dir>/ranks/rank<r>.json (`RankRecord`: status, steps,
the settings it trained with). The worker reads them and gives the trial ONE outcome,
whatever each rank saw: a preemption first, then an out-of-memory error, a divergence, a
prune, a failure, a pause only when every rank paused (at the rung they agreed on), and only
when every rank completed, rank 0's objective. A rank that fails alone (an OOM on rank 1)
exits with an error, so that the launcher stops the others, which then fail too: the OOM
still decides.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from app.config.schema import TrainConfig
from app.core.atomic import atomic_write_text
from app.core.errors import first_line
from app.core.outcomes import (
    Diverged,
    Paused,
    Preempted,
    Pruned,
    RunOutcome,
    Status,
    TrainingOOM,
    status_of,
)
from app.engine.comms.peers import exit_when_a_peer_fails
from app.engine.run import Observers, Run, Samples, StepHooks
from app.hpo import NullReporter, build_reporter

log = logging.getLogger(__name__)
# Which rank's ending becomes the trial's, first to last; paused only when every rank paused
# (each saved its part of the checkpoint), completed only when all completed.
PRECEDENCE = (
    Status.PREEMPTED,
    Status.OOM,
    Status.DIVERGED,
    Status.PRUNED,
    Status.FAILED,
    Status.PAUSED,
    Status.COMPLETED,
)
RAISES = {Status.OOM: TrainingOOM, Status.DIVERGED: Diverged, Status.PRUNED: Pruned}
# The agent's signal handlers, replaced while it runs: put back for the worker afterwards.
AGENT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
# How long the ranks of a preempted trial get to finish their step and checkpoint.
SHUTDOWN_S = 120


@dataclass
class RankRecord:
    """How one rank ended: <run dir>/ranks/rank<r>.json."""

    rank: int
    world_size: int
    pid: int
    devices: str | None  # CUDA_VISIBLE_DEVICES as the rank saw it
    status: str = Status.RUNNING.value
    steps: int = 0  # optimizer steps this rank finished
    resumed_from: int = 0  # the step it started at: a resumed (promoted) trial's checkpoint
    error: str | None = None
    signum: int | None = None
    objective: float | list[float] | None = None
    paused_at: int | None = None  # hpo.pruner=asha: the rung (the study's step) it paused at
    training: dict[str, object] = field(default_factory=dict)  # the settings it trained with
    ended_at: float | None = None  # time.time() when written: the first failing rank decides

    def write(self, run_dir: Path) -> None:
        self.ended_at = time.time()
        text = json.dumps(dataclasses.asdict(self), indent=1, default=str)
        atomic_write_text(record_path(run_dir, self.rank), text + "\n")

    @classmethod
    def read(cls, path: Path) -> RankRecord:
        return cls(**json.loads(path.read_text()))


def record_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir, "ranks", f"rank{rank}.json")


def trial_ranks(config: TrainConfig) -> int:
    """The ranks this run is to start: hpo.gpus_per_trial for a sweep's trial that is not
    already one of torchrun's ranks; else 1 (train here)."""
    hpo = config.hpo
    if hpo is None or hpo.trial_number is None or "WORLD_SIZE" in os.environ:
        return 1
    return max(1, int(hpo.gpus_per_trial))


def run_ranks(config: TrainConfig, run_dir: str | Path, nproc: int) -> float | list[float]:
    """Train as `nproc` ranks on this node; rank 0's objective, or the RunOutcome that ended
    the trial (one, whatever each rank saw)."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    run_dir = Path(run_dir)
    for old in run_dir.glob("ranks/rank*.json"):  # nothing of an earlier attempt decides
        old.unlink()
    launch = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"trial-{uuid.uuid4().hex[:12]}",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",  # a free port: several workers' trials on one node
        max_restarts=0,  # a failed rank ends the trial; the sweep decides about retries
        start_method="spawn",
        shutdown_timeout=SHUTDOWN_S,
    )
    stopped_by = None
    with agent_signals_restored():
        try:
            elastic_launch(launch, rank_main)(config, str(run_dir))
        except Exception as exc:  # a rank failed, or a signal stopped the agent
            stopped_by = getattr(exc, "sigval", None)
            log.warning("the trial's ranks ended early: %s", first_line(exc)[:300])
    if stopped_by is not None:  # the agent took the worker's signal: the worker hears it too
        signal.raise_signal(stopped_by)
    return one_outcome([RankRecord.read(p) for p in sorted(run_dir.glob("ranks/rank*.json"))])


@contextmanager
def agent_signals_restored() -> Iterator[None]:
    """torch's agent routes SIGTERM/SIGINT to the ranks while they run (each rank stops after
    its step and checkpoints), and leaves its handlers installed: the worker's come back."""
    previous = {sig: signal.getsignal(sig) for sig in AGENT_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            if handler is not None:
                signal.signal(sig, handler)


def one_outcome(records: list[RankRecord]) -> float | list[float]:
    """The trial's one ending: rank 0's objective when every rank completed, else the first
    ending in PRECEDENCE, raised as the run's outcome (the sweeper maps it to a state)."""
    if not records:
        raise RunOutcome("the trial's ranks ended before any of them recorded how")
    ended = {Status(r.status) for r in records}
    decisive = next((s for s in PRECEDENCE if s in ended), Status.FAILED)
    decided = [r for r in records if Status(r.status) == decisive]
    record = min(decided, key=first_ended) if decided else records[0]
    missing = sorted(set(range(record.world_size)) - {r.rank for r in records})
    if decisive in (Status.COMPLETED, Status.PAUSED) and missing:
        raise RunOutcome(f"rank(s) {missing} of {record.world_size} ended without a record")
    if decisive == Status.COMPLETED:
        return next(r for r in records if r.rank == 0).objective  # type: ignore[return-value]
    message = f"rank {record.rank} of {record.world_size}: {record.error or decisive.value}"
    if (record.error or "").startswith(f"rank {record.rank} of "):  # a lost peer's one line
        message = str(record.error)
    if decisive == Status.PAUSED:  # the same rung on every rank: they agreed on the pause
        raise Paused(message, step=int(record.paused_at or record.steps))
    if decisive == Status.PREEMPTED:
        raise Preempted(message, signum=record.signum or signal.SIGTERM, step=record.steps)
    raise RAISES.get(decisive, RunOutcome)(message)


class StepCounter(StepHooks):
    """Counts the optimizer steps this rank finished (a prune or a stop ends between them),
    and notes the step it started at."""

    def __init__(self, start: int = 0) -> None:
        self.done = start
        self.first: int | None = None

    def on_step_start(self, run: Run, step: int, batch: Samples) -> None:
        if self.first is None:
            self.first = step

    def on_step_end(self, run: Run, step: int) -> None:
        self.done = step + 1


def exit_with_parent(poll_s: float = 1.0) -> None:
    """End this rank when the worker that started it is gone (killed: nobody would read its
    result, and the launcher's child would wait for its reader forever, holding the GPU)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="rank-parent-watch", daemon=True).start()


def first_ended(record: RankRecord) -> tuple[float, int]:
    return (record.ended_at or 0.0, record.rank)  # records without a time: rank order


def rank_main(config: TrainConfig, run_dir: str) -> dict[str, object]:
    """One rank of the trial (in a process the launcher spawned): train, record how it ended.
    A prune or a pause, which every rank agreed on, ends it normally; a preemption with 128 +
    the signal, as a preempted run does; anything else is raised, so that the launcher stops
    the other ranks."""
    from app.engine.runner import run_training

    # A group of its own: Ctrl-C in a terminal reaches the rank through the agent alone, not
    # twice (a second signal ends a run at once, without its checkpoint).
    os.setpgrp()
    exit_with_parent()
    rank = int(os.environ.get("RANK", "0"))
    exit_when_a_peer_fails(Path(run_dir), rank)  # a rank lost for good ends with the trial
    record = RankRecord(
        rank=rank,
        world_size=int(os.environ.get("WORLD_SIZE", "1")),
        pid=os.getpid(),
        devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        training=dataclasses.asdict(config.training),
    )
    counter = StepCounter()
    reporter = build_reporter(config.hpo, config) if rank == 0 else NullReporter()
    try:
        summary = run_training(config, run_dir, Observers(reporter=reporter, hooks=counter))
    except BaseException as exc:
        status = status_of(exc) or Status.FAILED
        record.status, record.error, record.steps = status.value, str(exc)[:2000], counter.done
        record.resumed_from = counter.first or 0
        record.signum = getattr(exc, "signum", None)
        record.paused_at = exc.step if isinstance(exc, Paused) else None
        record.write(Path(run_dir))
        # Every rank stopped at that evaluation (a pause: each with its part saved): a normal end
        if status in (Status.PRUNED, Status.PAUSED):
            return dataclasses.asdict(record)
        if status == Status.PREEMPTED:  # leave at once: a stopping agent waits for no result
            raise SystemExit(128 + (record.signum or signal.SIGTERM)) from None
        raise
    record.status, record.steps = Status.COMPLETED.value, int(summary.steps or 0)
    record.resumed_from = int(summary.resumed_from_step or 0)
    record.objective = summary.objective(config.objective_keys)
    record.write(Path(run_dir))
    return dataclasses.asdict(record)
