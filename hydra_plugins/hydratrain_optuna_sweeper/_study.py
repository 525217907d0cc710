"""The shared study: storage, the study-wide trial budget, heartbeats and stale trials.

Budget. `hpo.n_trials` counts every trial of the study (any state, running included) except
those marked `hpo:uncounted`: a stale trial that was re-queued (its retry counts instead) and a
surplus trial (below). So a finished study holds exactly n_trials counted trials, each
COMPLETE, PRUNED or FAIL.

Race safety. A worker reserves a slot by asking for a trial and then re-checking how many
counted trials have a *lower* number; at n_trials or more the new trial is surplus: it is
failed at once with reason=surplus and marked uncounted. On the embedded journal storage the
count-ask-recheck runs under an exclusive file lock, so surplus trials never happen there; on
a database shared by several machines they are possible but rare, and never counted.

Heartbeat. Optuna's own heartbeat covers `optimize()` only, not ask/tell, so each worker runs a
thread that stamps `hpo:heartbeat` (a system attr, epoch seconds) on its running trial. Before
each ask, RUNNING trials whose stamp is older than hpo.stale_after are failed (reason=stale)
and, with hpo.retry_stale > 0, re-queued with the same parameters.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

from ._settings import HpoSettings, SweepConfigError

log = logging.getLogger(__name__)

HEARTBEAT = "hpo:heartbeat"
UNCOUNTED = "hpo:uncounted"
JOURNAL_NAME = "study.journal"


def is_url(storage: str) -> bool:
    return "://" in storage


def resolve_storage(storage: str | None, sweep_dir: str) -> str:
    """None -> the journal file in the sweep dir; a path -> absolute path; a URL as given."""
    if storage is None or str(storage) == "":
        return str(Path(sweep_dir, JOURNAL_NAME).absolute())
    storage = str(storage)
    return storage if is_url(storage) else str(Path(storage).absolute())


def open_storage(storage: str) -> BaseStorage:
    """An Optuna storage for a resolved `hpo.storage`; unreachable ones fail naming the key."""
    try:
        if is_url(storage):
            return optuna.storages.RDBStorage(storage)
        Path(storage).parent.mkdir(parents=True, exist_ok=True)
        return _journal(storage)
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise SweepConfigError(f"hpo.storage={storage!r} cannot be opened: {first}") from None


def _journal(path: str) -> BaseStorage:
    from optuna.storages import JournalStorage

    try:  # Optuna >= 4.0
        from optuna.storages.journal import JournalFileBackend
    except ImportError:  # pragma: no cover - Optuna 3.x
        from optuna.storages import JournalFileStorage as JournalFileBackend
    # The default (symlink) lock is fine on local disks; open-lock also works on NFS.
    lock = optuna.storages.journal.JournalFileOpenLock(path)
    return JournalStorage(JournalFileBackend(path, lock_obj=lock))


@contextlib.contextmanager
def budget_lock(storage: str) -> Iterator[None]:
    """Exclusive across processes on this machine for journal files; a no-op for databases."""
    if is_url(storage):
        yield
        return
    import fcntl

    with open(f"{storage}.budget.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def counted(trial: FrozenTrial) -> bool:
    return not trial.system_attrs.get(UNCOUNTED, False)


def count_toward_budget(trials: list[FrozenTrial]) -> int:
    return sum(1 for t in trials if counted(t))


class Budget:
    """Hands out trials until the study holds n_trials counted ones."""

    def __init__(self, study: optuna.Study, settings: HpoSettings, storage: str) -> None:
        self.study = study
        self.s = settings
        self.storage_url = storage
        self.mine: set[int] = set()  # trial ids this worker is running

    def next_trial(self) -> optuna.trial.Trial | None:
        with budget_lock(self.storage_url):
            fail_stale_trials(self.study, self.s, exclude=self.mine)
            trials = self.study.get_trials(deepcopy=False)
            waiting = any(t.state == TrialState.WAITING for t in trials if counted(t))
            if count_toward_budget(trials) >= self.s.n_trials and not waiting:
                return None
            trial = self.study.ask()
            stamp_heartbeat(self.study, trial._trial_id)
            if self._is_surplus(trial.number):
                self._discard(trial)
                return None
        self.mine.add(trial._trial_id)
        return trial

    def _is_surplus(self, number: int) -> bool:
        trials = self.study.get_trials(deepcopy=False)
        below = sum(1 for t in trials if t.number < number and counted(t))
        return below >= self.s.n_trials

    def _discard(self, trial: optuna.trial.Trial) -> None:
        log.info("Trial %d is beyond hpo.n_trials=%d: discarded", trial.number, self.s.n_trials)
        storage = self.study._storage
        storage.set_trial_system_attr(trial._trial_id, UNCOUNTED, True)
        trial.set_user_attr("reason", "surplus")
        self.study.tell(trial, state=TrialState.FAIL)

    def done(self, trial: optuna.trial.Trial) -> None:
        self.mine.discard(trial._trial_id)

    def others_running(self) -> bool:
        running = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        return any(t._trial_id not in self.mine for t in running)


def stamp_heartbeat(study: optuna.Study, trial_id: int) -> None:
    study._storage.set_trial_system_attr(trial_id, HEARTBEAT, time.time())


@contextlib.contextmanager
def heartbeat(study: optuna.Study, trial_id: int, interval: float) -> Iterator[None]:
    """Stamp the trial every `interval` seconds while the body (the training run) executes."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(interval):
            try:
                stamp_heartbeat(study, trial_id)
            except Exception as e:  # a finished trial or a storage hiccup: try again later
                log.debug("heartbeat for trial id %d failed: %s", trial_id, e)

    thread = threading.Thread(target=beat, name=f"hpo-heartbeat-{trial_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _last_beat(trial: FrozenTrial) -> float:
    beat = trial.system_attrs.get(HEARTBEAT)
    if beat is not None:
        return float(beat)
    start = trial.datetime_start
    return start.timestamp() if start is not None else time.time()


def fail_stale_trials(study: optuna.Study, s: HpoSettings, exclude: set[int]) -> list[int]:
    """Fail RUNNING trials whose heartbeat is older than hpo.stale_after; maybe re-queue them."""
    now = time.time()
    failed = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if t._trial_id in exclude or now - _last_beat(t) <= s.stale_after:
            continue
        retry = s.retry_stale > 0 and len(t.system_attrs.get("retry_history", [])) < s.retry_stale
        if _fail_stale(study, t, now - _last_beat(t), uncount=retry):
            failed.append(t.number)
            if retry:
                _requeue(study, t, s.retry_stale)
    return failed


def _fail_stale(study: optuna.Study, t: FrozenTrial, silent_for: float, uncount: bool) -> bool:
    storage = study._storage
    try:
        # Attributes first: a finished trial can no longer be changed. The state change is the
        # claim: only the worker whose update succeeds re-queues the trial.
        storage.set_trial_user_attr(t._trial_id, "reason", "stale")
        storage.set_trial_user_attr(
            t._trial_id, "error", f"no heartbeat for {silent_for:.0f}s (worker killed?)"
        )
        if uncount:  # its retry takes the slot
            storage.set_trial_system_attr(t._trial_id, UNCOUNTED, True)
        storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
    except Exception as e:  # another worker got there first
        log.debug("stale trial %d already handled: %s", t.number, e)
        return False
    log.warning("Trial %d had no heartbeat for %.0fs: failed as stale", t.number, silent_for)
    return True


def _retry_callback(max_retry: int) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # experimental / deprecated-alias warnings
        cls = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
        cls = cls or optuna.storages.RetryFailedTrialCallback
        return cls(max_retry=max_retry)


def _requeue(study: optuna.Study, t: FrozenTrial, max_retry: int) -> None:
    """Queue the same parameters again through Optuna's own retry callback."""
    clean = copy.deepcopy(t)
    # Our bookkeeping must not leak into the retry (it would start uncounted or stale).
    clean.system_attrs = {k: v for k, v in t.system_attrs.items() if not k.startswith("hpo:")}
    clean.user_attrs = {k: v for k, v in t.user_attrs.items() if k not in ("reason", "error")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _retry_callback(max_retry)(study, clean)
    log.info("Trial %d re-queued with the same parameters", t.number)


def pid_tag() -> str:
    return f"{os.uname().nodename}:{os.getpid()}"
