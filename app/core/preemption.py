"""Graceful preemption: SIGTERM or SIGINT ends a run after its current optimizer step.

SLURM, Kubernetes and spot instances send SIGTERM some seconds before they kill a job; Ctrl-C
sends SIGINT. The first one only sets a flag: the loop finishes the optimizer step it is in,
writes a checkpoint and the summary (status `preempted`) and stops, so `training.resume=auto`
continues exactly. A second signal ends the process at once, by the signal's default action.
The exit status of a preempted run is 128 + the signal number (143 for SIGTERM, 130 for SIGINT),
what a shell reports for a process the signal ended.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass

log = logging.getLogger(__name__)
SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass
class StopRequest:
    """Set by a signal handler; read by the loop after each optimizer step."""

    signum: int | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else "none"

    @property
    def exit_status(self) -> int:
        return 128 + (self.signum or 0)


FINISH_STEP = "finishing this optimizer step, then a checkpoint and the summary"


# The requests of the blocks now inside stop_on_signals, outermost first: a sweep's worker, then
# the trial it runs in this process. A signal is a request to every one of them, so the worker
# stops after its trial however the trial ends (a save that fails at the stop included).
_ACTIVE: list[StopRequest] = []


def stop_requested() -> bool:
    """A stop was requested of a block of this process now inside stop_on_signals."""
    return any(request.requested for request in _ACTIVE)


@contextlib.contextmanager
def stop_on_signals(stop: StopRequest, then: str = FINISH_STEP) -> Iterator[StopRequest]:
    """Route SIGTERM/SIGINT into `stop` for the duration of the block, then restore the
    previous handlers (a sweeper's, say). A block inside another (a trial run by a sweep's
    worker) takes the signal first; the enclosing blocks' requests are set too. `then` says what
    happens next, in the line logged. Signals can only be handled in the main thread;
    elsewhere the block runs unprotected."""
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handle(signum: int, _frame) -> None:
        if stop.requested:  # the second signal: stop now, as if no one had caught it
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        for request in _ACTIVE:
            request.signum = request.signum or signum
        stop.signum = signum
        log.warning(
            "%s received: %s (send it again to stop at once)", signal.Signals(signum).name, then
        )

    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    for sig in SIGNALS:
        signal.signal(sig, handle)
    _ACTIVE.append(stop)
    try:
        yield stop
    finally:
        _ACTIVE.remove(stop)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
