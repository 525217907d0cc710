"""A fleet on this node: N worker processes on one study, with no barrier among them.

Each worker is this same command run again (the ordinary one-process worker: it asks for the
next trial as soon as its trial ends), told by WORKER_ENV that it is worker <n> and pinned by
CUDA_VISIBLE_DEVICES, set before the process starts, so before CUDA does. The parent starts
them as soon as the fleet is planned, before it checks the search space and opens the study:
a worker checks the same settings itself and opens (or creates) the same study, so its
start-up runs beside the parent's rather than after it; should the parent's checks fail, it
stops them. Its output goes to <sweep dir>/workers/worker_<n>.log; the parent prints one line
per finished trial, read from the study, which is also how a fleet of launcher jobs is
watched (`_fleet_jobs`).

The parent forwards SIGTERM/SIGINT to every worker once per signal it gets (each worker
preempts its trial as a lone worker does), and starts them in sessions of their own so that
Ctrl-C in a terminal reaches them through the parent only: one signal each, not two (a
second signal ends a worker at once). A worker that dies does not stop the others; the
parent fails the trial it was running as stale at once (re-queued per hpo.retry_stale),
rather than after hpo.stale_after without a heartbeat.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import IO

import optuna
from optuna.trial import FrozenTrial, TrialState

from app.studies.report import preload as preload_report

from .._errors import SweepConfigError
from .._study._fleet_plan import FleetPlan, WorkerIdentity
from .._study._settings import SweepSettings
from .._study._shared import budget_lock, every, fail_as_stale
from .._study._space import format_value
from .._study._warm_start import is_borrowed

log = logging.getLogger(__name__)
SIGNALS = (signal.SIGTERM, signal.SIGINT)
TICK = 0.05  # seconds between looks at the worker processes (a poll of each: cheap)


class TrialTicker:
    """Prints one line per trial that finished since the fleet started (now, or `since`: its
    workers may finish trials before the parent reads the study), as a worker would."""

    def __init__(self, study: optuna.Study, since: datetime | None = None) -> None:
        self.study = study
        self.seen = {
            t.number
            for t in study.get_trials(deepcopy=False)
            if t.state.is_finished()
            and (since is None or t.datetime_complete is None or t.datetime_complete < since)
        }

    def poll(self) -> None:
        try:
            trials = self.study.get_trials(deepcopy=False)
        except Exception as e:  # a storage hiccup: the next look catches up
            log.debug("could not read the study: %s", e)
            return
        for t in trials:
            if is_borrowed(t):  # added finished by a warm start: not a trial of the fleet's
                continue
            if t.state.is_finished() and t.number not in self.seen:
                self.seen.add(t.number)
                log.info("Trial %d %s %s %s", t.number, t.state.name, t.values or "", _by(t))

    @contextlib.contextmanager
    def in_background(self, interval: float) -> Iterator[None]:
        """Poll every `interval` seconds while the body waits (on a launcher's jobs)."""
        try:
            with every(interval, self.poll, "hpo-fleet-ticker"):
                yield
        finally:
            self.poll()


def _by(t: FrozenTrial) -> str:
    reason = t.user_attrs.get("reason") if t.state != TrialState.COMPLETE else None
    who = f"worker {t.user_attrs.get('worker')}" if "worker" in t.user_attrs else ""
    devices = t.user_attrs.get("devices")
    where = f" (devices {devices})" if devices else ""
    return " ".join(x for x in (reason, who + where) if x)


@dataclass
class Member:
    index: int
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    status: int | None = None
    out: IO[bytes] | None = field(default=None, repr=False)

    def describe(self) -> str:
        devices = self.env.get("CUDA_VISIBLE_DEVICES")
        return f"worker {self.index}" + (f" (devices {devices})" if devices else "")


class LocalFleet:
    def __init__(self, plan: FleetPlan, settings: SweepSettings, sweep_dir: str) -> None:
        self.plan = plan
        self.s = settings
        self.sweep_dir = sweep_dir
        self.members = [Member(i, plan.env(i)) for i in range(plan.workers)]
        self.signum: int | None = None
        self.since = datetime.now()

    @contextlib.contextmanager
    def started(self) -> Iterator[LocalFleet]:
        """Start the workers now and forward signals to them while the body prepares the study
        and `watch`es them. A body that raises (the parent's checks failed: each worker's
        same checks fail too) stops the workers that still run and waits for them."""
        command = worker_command(self.sweep_dir)
        with self._forwarding_signals():
            self.since = datetime.now()
            for m in self.members:
                if self.signum is None:
                    self._start(m, command)
                else:  # stopped while starting them: the rest never start
                    m.status = 128 + self.signum
            try:
                yield self
            except BaseException:
                self._stop()
                raise

    def watch(self, study: optuna.Study) -> int:
        """Watch the workers until every one ended; 0 when all ended cleanly, 128 + the signal
        that stopped them, else 1 (after one `error:` line). Meanwhile the report's imports
        load beside the wait, so that the report is written as soon as the last worker ends."""
        threading.Thread(target=preload_report, name="hpo-report-preload", daemon=True).start()
        self._watch(study, TrialTicker(study, since=self.since))
        return self._status()

    def _start(self, m: Member, command: list[str]) -> None:
        folder = Path(self.sweep_dir, "workers")
        folder.mkdir(parents=True, exist_ok=True)
        m.log_path = folder / f"worker_{m.index}.log"
        m.out = open(m.log_path, "ab")  # noqa: SIM115 - closed when the worker ends
        m.proc = subprocess.Popen(
            command,
            env={**os.environ, **m.env},
            stdin=subprocess.DEVNULL,
            stdout=m.out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches it through the parent alone
        )
        log.info("Started %s: pid %d, log %s", m.describe(), m.proc.pid, m.log_path)

    def _watch(self, study: optuna.Study, ticker: TrialTicker) -> None:
        next_look = 0.0
        while any(m.status is None for m in self.members):
            for m in self.members:
                if m.status is None and m.proc is not None and m.proc.poll() is not None:
                    self._ended(study, m)
            if time.monotonic() >= next_look:
                ticker.poll()
                next_look = time.monotonic() + self.s.liveness.poll_interval
            time.sleep(TICK)
        ticker.poll()

    def _ended(self, study: optuna.Study, m: Member) -> None:
        assert m.proc is not None and m.out is not None
        m.status = m.proc.returncode
        m.out.close()
        forwarded = self.signum is not None and m.status == 128 + self.signum
        if m.status != 0 and not forwarded:
            log.warning("%s ended: %s; log %s", m.describe(), _exit_text(m.status), m.log_path)
        why = f"{m.describe()} (pid {m.proc.pid}) ended: {_exit_text(m.status)}"
        for number in fail_orphans(study, self.s, m.proc.pid, why):
            log.warning("Trial %d was running in %s: failed as stale", number, m.describe())

    def _stop(self) -> None:
        """Stop the workers that still run (before their first trial, this ends them at
        once) and wait for each: the parent leaves no worker behind."""
        for m in self.members:
            if m.proc is not None and m.status is None:
                with contextlib.suppress(ProcessLookupError):
                    m.proc.send_signal(signal.SIGTERM)
        for m in self.members:
            if m.proc is not None and m.out is not None and m.status is None:
                m.status = m.proc.wait()
                m.out.close()

    @contextlib.contextmanager
    def _forwarding_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def forward(signum: int, _frame: FrameType | None) -> None:
            self.signum = self.signum or signum
            log.warning(
                "%s received: passed to every worker, which records its trial and stops "
                "(send it again to stop them at once)",
                signal.Signals(signum).name,
            )
            for m in self.members:
                if m.proc is not None and m.status is None:
                    with contextlib.suppress(ProcessLookupError):
                        m.proc.send_signal(signum)

        previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
        for sig in SIGNALS:
            signal.signal(sig, forward)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _status(self) -> int:
        statuses = [(m.describe(), m.status) for m in self.members]
        return ending(statuses, self.sweep_dir, self.signum)


def ending(statuses: Sequence[tuple[str, int | None]], sweep_dir: str, signum: int | None) -> int:
    """The fleet's exit status, after one line saying why when it is not 0: 128 + the signal
    that stopped the workers, else 1 when a worker did not end cleanly."""
    bad = [(who, status) for who, status in statuses if status != 0]
    stopped = [s - 128 for _, s in bad if s is not None and s > 128]
    if signum is None and bad and len(stopped) == len(bad):
        signum = stopped[0]  # stopped by signals of their own (a scheduler's)
    if signum is not None:
        print(
            f"stopped: {_signal_name(signum)}: every worker recorded its trials and stopped; "
            "rerun the same command to resume the study",
            file=sys.stderr,
            flush=True,
        )
        return 128 + signum
    if not bad:
        return 0
    what = "; ".join(f"{who}: {_exit_text(status)}" for who, status in bad)
    print(
        f"error: {len(bad)} of {len(statuses)} workers did not end cleanly ({what}); "
        f"their logs: {Path(sweep_dir, 'workers')}",
        file=sys.stderr,
        flush=True,
    )
    return 1


def worker_command(sweep_dir: str) -> list[str]:
    """This process's command line, in the sweep directory it already chose (a sweep dir of
    `${now:...}` would otherwise differ by a second)."""
    argv = list(getattr(sys, "orig_argv", []))
    given = sys.argv[1:]
    if not argv or (given and argv[-len(given) :] != given):
        raise SweepConfigError(
            "hpo.workers: a fleet starts its workers with this process's command line, which "
            "is not the one Hydra parsed here; run the sweep from a command line"
        )
    return [sys.executable, *argv[1:], f"hydra.sweep.dir={format_value(sweep_dir)}"]


def fail_orphans(study: optuna.Study, s: SweepSettings, pid: int, why: str) -> list[int]:
    """Fail the RUNNING trials of a worker process of this host that has ended."""
    here = WorkerIdentity.here().host
    failed = []
    with budget_lock(s.storage.lock_path):
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            mine = t.user_attrs.get("worker_pid") == pid and t.user_attrs.get("host") == here
            if mine and fail_as_stale(study, t, s.liveness, why):
                failed.append(t.number)
    return failed


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _exit_text(status: int | None) -> str:
    if status is not None and status < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-status).name}"
    return f"exit status {status}"
