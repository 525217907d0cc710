"""The shared study: the trial budget, heartbeats, stale trials and re-queued trials.

TrialBudget. The stock `n_trials` is this many more trials per run (`RunTrialBudget`). Ours are
study-wide (`StudyTrialBudget`): `hpo.budget_trials` (the default) hands out trials until the study
has trained that many full trials' worth (`_cost.TrialsWorth`: a trial pruned at a third of
its data spent a third), and `hpo.n_trials`, where set, counts every trial of the study (any
state, running included) except those marked `hpo:uncounted`: a stale or preempted trial that
was re-queued (its retry counts instead) and a surplus trial (below). So a finished study holds
exactly n_trials counted trials.

Race safety (`StudyTrialBudget`). A worker reserves a slot by asking for a trial and then
re-checking how many counted trials have a *lower* number; at n_trials or more the new trial
is surplus: it is failed at once with reason=surplus and marked uncounted. On a journal file
the count-ask-recheck runs under an exclusive file lock, so surplus trials never happen there;
on a database shared by several machines they are possible but rare, and never counted.

Heartbeat. Optuna's own heartbeat covers `optimize()` only, not ask/tell, so each worker runs a
thread that stamps `hpo:heartbeat` (a system attr, epoch seconds) on its running trials. Before
each ask, RUNNING trials whose stamp is older than hpo.stale_after are failed (reason=stale)
and, with hpo.retry_stale > 0, re-queued with the same parameters.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from .. import _private as private
from .._pruners._kind import Promotes
from .._pruners._lineage import BORROWED_FROM, UNCOUNTED, copy_attrs, promoted
from ._cost import CostCap, TrialsWorth
from ._settings import Liveness
from ._storage import retrying

log = logging.getLogger(__name__)

HEARTBEAT = "hpo:heartbeat"


@contextlib.contextmanager
def budget_lock(path: str | None) -> Iterator[None]:
    """Exclusive across the processes of this machine (a journal file); else a no-op."""
    if path is None:
        yield
        return
    import fcntl

    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def counted(trial: FrozenTrial) -> bool:
    return not trial.system_attrs.get(UNCOUNTED, False)


def count_toward_budget(trials: list[FrozenTrial]) -> int:
    return sum(1 for t in trials if counted(t))


def uncount(study: optuna.Study, trial: Trial | FrozenTrial) -> None:
    private.set_system_attr(study, trial, UNCOUNTED, True)


class TrialBudget(abc.ABC):
    """Hands out trials in batches; subclasses say how many. `promoter` (a pruner that pauses: asha)
    queues a paused trial that qualifies before a new one is asked for; `cost` (hpo.budget_s)
    ends the study once its trials spent that many device-seconds; `worth`
    (hpo.budget_trials) once they trained that many full trials' worth. `n_trials` None: no
    count of trials (a budget in worth). `draw` samples a new trial's point, so that no two
    running trials are handed the same one (`_distinct`)."""

    def __init__(
        self,
        study: optuna.Study,
        n_trials: int | None,
        lock_path: str | None,
        live: Liveness,
        *,
        promoter: Promotes | None = None,
        cost: CostCap | None = None,
        worth: TrialsWorth | None = None,
        draw: Callable[[Trial], object] | None = None,
    ) -> None:
        self.study = study
        self.n_trials = n_trials
        self.lock_path = lock_path
        self.live = live
        self.promoter = promoter
        self.cost = cost
        self.worth = worth
        self.draw = draw  # samples a new trial's point (the search space), to compare it
        self.mine: set[int] = set()  # trial ids this worker is running

    def next_trials(self, k: int) -> list[Trial]:
        """Up to k trials; fewer (or none) when the budget is spent."""
        trials: list[Trial] = []
        with budget_lock(self.lock_path):
            fail_stale_trials(self.study, self.live, exclude=self.mine)
            while len(trials) < k and (trial := self._next()) is not None:
                trials.append(trial)
        self.mine |= {private.trial_id(t) for t in trials}
        return trials

    def _next(self) -> Trial | None:
        if self.cost is not None and self.cost.spent():
            return None
        if self.promoter is not None:
            self.promoter.promote()  # queued: the ask below pops it
        while (trial := self._ask()) is not None and self._duplicate(trial):
            pass
        return self._distinct(trial)

    def _distinct(self, trial: Trial | None) -> Trial | None:
        """A point no running trial holds. Two workers asking at once past the start-up may be
        drawn the same point (on a small discrete space the constant liar does not keep the
        second off it): the second trial is dropped (FAIL, `duplicate`, not counted) and the
        point drawn again at random, a few times at most (more workers than points share)."""
        for attempt in range(REDRAWS):
            twin = None if trial is None else self._running_twin(trial)
            if trial is None or twin is None:
                return trial
            log.info(
                "Trial %d was drawn trial %d's point, which runs: drawn again", trial.number, twin
            )
            trial.set_user_attr("reason", "duplicate")
            uncount(self.study, trial)
            self.study.tell(trial, state=TrialState.FAIL)
            with _drawing_at_random(self.study, seed=trial.number + attempt):
                trial = self._ask()
                if trial is not None and self.draw is not None:
                    self.draw(trial)
        return trial

    def _running_twin(self, trial: Trial) -> int | None:
        """The number of a running trial with the point the sampler drew for `trial`."""
        if self.draw is None or "fixed_params" in private.frozen(self.study, trial).system_attrs:
            return None  # nothing to compare, or queued as given (hpo.enqueue, a copy)
        self.draw(trial)
        params = private.frozen(self.study, trial).params
        for other in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if other.number != trial.number and other.params == params:
                return other.number
        return None

    def promote_at_end(self) -> bool:
        """The budget is spent and nothing else runs: promote what each rung's best still
        needs (a pruner that pauses; `promote(final=True)`)."""
        if self.promoter is None:
            return False
        with budget_lock(self.lock_path):
            if self.cost is not None and self.cost.spent():
                return False
            return bool(self.promoter.promote(final=True))

    def _duplicate(self, trial: Trial) -> bool:
        if self.promoter is None:
            return False
        if not self.promoter.is_duplicate(private.frozen(self.study, trial)):
            return False
        trial.set_user_attr("reason", "duplicate")
        self.study.tell(trial, state=TrialState.FAIL)
        return True

    def _waiting(self, trials: list[FrozenTrial]) -> bool:
        return any(t.state == TrialState.WAITING for t in trials)

    @abc.abstractmethod
    def _ask(self) -> Trial | None:
        """A new trial, or None when the budget is spent."""

    def _new_trial(self) -> Trial:
        trial = retrying(self.study.ask, "ask")
        stamp_heartbeat(self.study, trial)
        return trial

    def done(self, trial: Trial) -> None:
        self.mine.discard(private.trial_id(trial))

    def release(self, trial: Trial) -> None:
        """The trial was preempted: it does not count, its re-queued copy does."""
        uncount(self.study, trial)

    def _counts(self, trial: Trial) -> bool:
        """A trial that takes a slot: not a promoted copy (its paused trial holds one)."""
        return counted(private.frozen(self.study, trial))

    def others_running(self) -> bool:
        return False

    def _spent(self, trials: list[FrozenTrial]) -> bool:
        """The budget holds no new trial (trials already queued still run)."""
        if self._waiting(trials):
            return False
        if self.worth is not None and not self.worth.left():
            return True
        return self.n_trials is not None and self._used(trials) >= self.n_trials

    def _used(self, trials: list[FrozenTrial]) -> int:
        """Trials that took a slot of n_trials."""
        return count_toward_budget(trials)


class RunTrialBudget(TrialBudget):
    """The stock `n_trials`: this many more trials in this run, whatever the study holds."""

    started = 0

    def _used(self, trials: list[FrozenTrial]) -> int:
        return self.started

    def _ask(self) -> Trial | None:
        copies = [t for t in self.study.get_trials(deepcopy=False) if not counted(t)]
        if self._spent(copies):
            return None
        trial = self._new_trial()
        self.started += self._counts(trial)
        return trial

    def release(self, trial: Trial) -> None:
        if self._counts(trial):
            self.started -= 1
        super().release(trial)


class StudyTrialBudget(TrialBudget):
    """`hpo.budget_trials` or `hpo.n_trials`: study-wide, shared by every worker."""

    def _ask(self) -> Trial | None:
        if self._spent(self.study.get_trials(deepcopy=False)):
            return None
        trial = self._new_trial()
        if self._counts(trial) and self._is_surplus(trial.number):
            self._discard(trial)
            return None
        return trial

    def _is_surplus(self, number: int) -> bool:
        if self.n_trials is None:  # a budget in worth: the check before the ask decides
            return False
        trials = self.study.get_trials(deepcopy=False)
        below = sum(1 for t in trials if t.number < number and counted(t))
        return below >= self.n_trials

    def _discard(self, trial: Trial) -> None:
        log.info("Trial %d is beyond hpo.n_trials=%d: discarded", trial.number, self.n_trials)
        uncount(self.study, trial)
        trial.set_user_attr("reason", "surplus")
        self.study.tell(trial, state=TrialState.FAIL)

    def others_running(self) -> bool:
        running = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        return any(private.trial_id(t) not in self.mine for t in running)


REDRAWS = 8  # draws of a point a running trial holds, before two trials share it


@contextlib.contextmanager
def _drawing_at_random(study: optuna.Study, seed: int) -> Iterator[None]:
    """The study's sampler is a random one for the block (a redraw), then its own again."""
    sampler = study.sampler
    study.sampler = optuna.samplers.RandomSampler(seed=seed)
    try:
        yield
    finally:
        study.sampler = sampler


def stamp_heartbeat(study: optuna.Study, trial: Trial | FrozenTrial) -> None:
    private.set_system_attr(study, trial, HEARTBEAT, time.time())


def heartbeat(
    study: optuna.Study, trials: list[Trial], interval: float
) -> contextlib.AbstractContextManager[None]:
    """Stamp the trials every `interval` seconds while the body (their jobs) executes."""

    def beat() -> None:
        for trial in trials:
            try:
                stamp_heartbeat(study, trial)
            except Exception as e:  # finished elsewhere, or a storage hiccup: next time
                log.debug("heartbeat for trial %d failed: %s", trial.number, e)

    return every(interval, beat, "hpo-heartbeat")


@contextlib.contextmanager
def every(interval: float, call: Callable[[], object], name: str) -> Iterator[None]:
    """Call `call` every `interval` seconds on a thread of its own while the body runs."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval):
            call()

    thread = threading.Thread(target=loop, name=name, daemon=True)
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


def fail_stale_trials(study: optuna.Study, live: Liveness, exclude: set[int]) -> list[int]:
    """Fail RUNNING trials whose heartbeat is older than hpo.stale_after; maybe re-queue them."""
    now = time.time()
    failed = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        silent = now - _last_beat(t)
        if private.trial_id(t) in exclude or silent <= live.stale_after:
            continue
        if fail_as_stale(study, t, live, f"no heartbeat for {silent:.0f}s (worker killed?)"):
            failed.append(t.number)
            log.warning("Trial %d had no heartbeat for %.0fs: failed as stale", t.number, silent)
    return failed


def fail_as_stale(study: optuna.Study, t: FrozenTrial, live: Liveness, error: str) -> bool:
    """Fail a RUNNING trial whose worker is gone, re-queued per hpo.retry_stale; False when
    another worker got there first."""
    retry = live.retry_stale > 0 and len(private.retry_history(t)) < live.retry_stale
    if not _fail_stale(study, t, error, uncount=retry):
        return False
    if retry:  # a resumed run (promoted, preempted) resumes again: from where it started
        resume = t.user_attrs.get("resume_from")
        requeue(study, t, {"resume_from": resume} if resume else None)
    return True


def _fail_stale(study: optuna.Study, t: FrozenTrial, error: str, uncount: bool) -> bool:
    try:
        # Attributes first: a finished trial can no longer be changed. The state change is the
        # claim: only the worker whose update succeeds re-queues the trial.
        with private.finished_trial_guard():
            private.set_user_attr(study, t, "reason", "stale")
            private.set_user_attr(study, t, "error", error)
            if uncount:  # its retry takes the slot
                private.set_system_attr(study, t, UNCOUNTED, True)
    except private.TrialFinished:  # another worker got there first
        return False
    return private.claim_failed(study, t)


def requeue(
    study: optuna.Study, t: FrozenTrial, user_attrs: Mapping[str, object] | None = None
) -> None:
    """Queue the same parameters again, recorded as Optuna's RetryFailedTrialCallback does
    (`failed_trial`, `retry_history`), so its `retried_trial_number()` works on them."""
    system_attrs = {**private.retry_attrs(t), **copy_attrs(t)}
    if promoted(t):  # a promoted trial's copy: its paused trial still holds the slot
        system_attrs[UNCOUNTED] = True
    study.add_trial(
        optuna.trial.create_trial(
            state=TrialState.WAITING,
            params=t.params,
            distributions=t.distributions,
            user_attrs={**_lineage_attrs(t), **(user_attrs or {})},
            system_attrs=system_attrs,
        )
    )
    log.info("Trial %d re-queued with the same parameters", t.number)


def _lineage_attrs(t: FrozenTrial) -> dict[str, object]:
    """The user attrs a copy keeps: where a borrowed configuration came from."""
    return {BORROWED_FROM: t.user_attrs[BORROWED_FROM]} if BORROWED_FROM in t.user_attrs else {}
