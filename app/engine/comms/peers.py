"""A rank that cannot meet its peers ends the run within `training.peer_timeout_s`, with one line.

Under torchrun every collective waits for all ranks. A rank lost inside one (out of memory
inside FSDP's all-gather, stuck in a driver call, a host that stopped) would hold the others
for the process group's timeout, 30 minutes under gloo and 10 under NCCL by torch's defaults,
while every GPU of the run idles. The group is created with training.peer_timeout_s instead
(app/engine/comms/distributed.py), so a collective that waits longer raises on the waiting rank;
`answering_peers` turns that error into `PeersLost`, one line naming the rank, the phase it
waited in and the step: "rank 0 of 2: no answer from its peers within 5s in forward (step 2)".
Its status is FAILED: the trial's parameters did not make it hopeless (a prune would tell the
sampler and the pruner so), and a failed trial can be retried.

The lost rank itself may never raise (a sleep, a call that does not return): in a sweep's
trial every rank watches the others' records (`exit_when_a_peer_fails`) and leaves once
another rank ended with a failure, so the trial ends on every rank within the timeout and a
few seconds, not after the launcher's stop (30 s, then SIGKILL). Under plain torchrun that
stop is what ends it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from app.config.training import FAULT_PHASES
from app.core.outcomes import RunOutcome, Status
from app.engine.comms.agreement import Agreement
from app.engine.comms.distributed import DistInfo

log = logging.getLogger(__name__)
TRIAL_TIMEOUT_S = 60.0  # training.peer_timeout_s=null in a sweep's trial on several ranks
RUN_TIMEOUT_S = 600.0  # ... in a torchrun run (NCCL's own default)
# What torch.distributed says (torch 2.13) when a peer does not answer or has gone: gloo's
# errors are plain RuntimeErrors, so their words are all there is to tell them by; NCCL's
# watchdog raises DistBackendError.
TIMED_OUT = (
    "timed out waiting",  # gloo: "Timed out waiting 5000ms for recv operation to complete"
    "application timeout caused pair closure",  # gloo: the next collective after one
    "collective operation timeout",  # NCCL: "Watchdog caught collective operation timeout"
)
GONE = ("connection closed by peer", "connection reset by peer", "communicator was aborted")
# A rank's ending that the others cannot share: they are left waiting for it.
LEAVES_ALONE = (Status.FAILED.value, Status.OOM.value)
GRACE_S = 5.0  # for a rank that saw its peer leave to record its own ending before it is ended


class PeersLost(RunOutcome):
    """A collective found the peers gone or silent past training.peer_timeout_s."""

    status = Status.FAILED


def peer_timeout_s(setting: float | None, in_trial: bool) -> float:
    """training.peer_timeout_s, or its default for this kind of run."""
    if setting is not None:
        return float(setting)
    return TRIAL_TIMEOUT_S if in_trial else RUN_TIMEOUT_S


@contextlib.contextmanager
def answering_peers(info: DistInfo, where: Callable[[], Agreement | None]) -> Iterator[None]:
    """Raise PeersLost, with the one line, for a collective that lost the peers inside the
    block; `where`: the run's agreement, which knows the phase this rank is in and its step
    (None while the run is being built)."""
    try:
        yield
    except RuntimeError as exc:
        line = lost_line(exc, info, *whereabouts(where()))
        if line is None:
            raise
        info.peers_lost = True
        raise PeersLost(line) from exc  # the run's one line: the entry or the trial prints it


def whereabouts(agreement: Agreement | None) -> tuple[str, int]:
    """Where this rank is, in words (its last phase boundary), and its step."""
    if agreement is None:
        return "while starting", 0
    phase = agreement.phase
    return (f"in {phase}" if phase in FAULT_PHASES else f"after it {phase}"), agreement.step


def lost_line(exc: BaseException, info: DistInfo, at: str, step: int) -> str | None:
    """The one line for an error that says the peers did not answer or have gone; None for
    any other error (out of memory is a RuntimeError too, and no collective's)."""
    if not info.enabled:
        return None
    text = str(exc).lower()
    if any(word in text for word in TIMED_OUT):
        return (
            f"rank {info.rank} of {info.world_size}: no answer from its peers within "
            f"{info.timeout_s:g}s {at} (step {step})"
        )
    if any(word in text for word in GONE):
        return (
            f"rank {info.rank} of {info.world_size}: its peers left {at} (step {step}): "
            f"{str(exc).strip().splitlines()[0][:200]}"
        )
    return None


def exit_when_a_peer_fails(run_dir: Path, rank: int, poll_s: float = 0.5) -> None:
    """End this rank GRACE_S after another rank of the trial recorded an ending it cannot
    share (<run dir>/ranks/rank<r>.json: failed, out of memory): this one, if it still runs,
    waits for that rank in a collective or is the lost one, and nobody will answer it."""

    def watch() -> None:
        while not peer_failed(run_dir, rank):
            time.sleep(poll_s)
        time.sleep(GRACE_S)
        log.error("rank %d: a peer ended the trial; this rank ends too", rank)
        os._exit(1)

    threading.Thread(target=watch, name="rank-peer-watch", daemon=True).start()


def peer_failed(run_dir: Path, rank: int) -> bool:
    for path in Path(run_dir, "ranks").glob("rank*.json"):
        if path.name == f"rank{rank}.json":
            continue
        try:
            status = json.loads(path.read_text()).get("status")
        except (OSError, ValueError):  # written atomically, but maybe gone with an old attempt
            continue
        if status in LEAVES_ALONE:
            return True
    return False
