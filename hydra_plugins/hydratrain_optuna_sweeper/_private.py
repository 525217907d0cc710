"""Every use of a private Optuna or Hydra attribute, and nothing else.

Optuna's public API covers one process asking and telling its own trials. Several workers on
one study also need to write system attributes (heartbeats, bookkeeping) on trials, fail a
trial another worker owns as a claim only one worker wins, and rebuild a running trial in the
job's process from its number. Hydra's public `JobReturn.return_value` prints to stderr and
raises for a failed job, where the sweeper wants the exception as a value. And an update to a
trial that another worker finished meanwhile raises `UpdateFinishedTrialError` from Optuna
4.1 on, a plain RuntimeError before: `finished_trial_guard` turns both into `TrialFinished`.
The stock sweeper warns about its legacy `search_space` node through Hydra's internal
`deprecation_warning`, which honours HYDRA_DEPRECATION_WARNINGS_AS_ERRORS: so does ours.
A re-queued trial is recorded as Optuna's RetryFailedTrialCallback records one, in its system
attrs `failed_trial` and `retry_history`, so that
`RetryFailedTrialCallback.retried_trial_number` works on ours: `retry_history` and
`retry_attrs` read and write them. Optuna's samplers read a study's trials through its private
`_get_trials`: `trials_seen_as` gives a sampler a study whose trials (that method and the
public ones built on it) are shown through a function, so that a line of trials is one
observation (`_lineage.observations`). On Optuna 4.x a sampler's `constraints_func` is stored
after each trial it told in the system attr `_CONSTRAINTS_KEY`; a trial added finished (a warm
start's borrowed one) never passes there, so `sampler_constraints` writes what it would have.
Whether a value lies in a distribution is Optuna's private `_contains` (`contains`): a warm
start maps earlier trials into a space with exactly the test `create_trial` will apply.

tests/test_sweeper_private_api.py exercises each function on every storage kind; CI runs it on
Optuna 4.x as well as the installed 5.x (.ci/run).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Container, Iterator

import optuna
from hydra.core.utils import JobReturn, JobStatus
from optuna.distributions import BaseDistribution
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, Trial, TrialState


class TrialFinished(Exception):
    """An update to a trial that was finished meanwhile (by another worker)."""


def _update_finished(exc: BaseException) -> bool:
    cls = getattr(optuna.exceptions, "UpdateFinishedTrialError", None)
    if cls is not None:
        return isinstance(exc, cls)
    return isinstance(exc, RuntimeError) and "has already finished" in str(exc)


@contextlib.contextmanager
def finished_trial_guard() -> Iterator[None]:
    """Raise TrialFinished for an update to a finished trial, whatever this Optuna raises."""
    try:
        yield
    except Exception as e:
        if _update_finished(e):
            raise TrialFinished(str(e)) from None
        raise


def storage_of(study: optuna.Study) -> BaseStorage:
    return study._storage


def trial_id(trial: Trial | FrozenTrial) -> int:
    return trial._trial_id


def set_system_attr(
    study: optuna.Study, trial: Trial | FrozenTrial, key: str, value: int | float
) -> None:
    storage_of(study).set_trial_system_attr(trial_id(trial), key, value)


def set_user_attr(study: optuna.Study, trial: Trial | FrozenTrial, key: str, value: object) -> None:
    """A user attribute on any running trial, this worker's or another's."""
    storage_of(study).set_trial_user_attr(trial_id(trial), key, value)


def frozen(study: optuna.Study, trial: Trial | FrozenTrial) -> FrozenTrial:
    """The trial as the storage has it now (another worker may have changed it)."""
    return storage_of(study).get_trial(trial_id(trial))


def claim_failed(study: optuna.Study, trial: FrozenTrial) -> bool:
    """Move a RUNNING trial to FAIL; True only for the one caller whose update did it."""
    try:
        with finished_trial_guard():
            return bool(storage_of(study).set_trial_state_values(trial_id(trial), TrialState.FAIL))
    except TrialFinished:
        return False


def live_trial(study: optuna.Study, number: int) -> Trial:
    """A `Trial` for the running trial `number`, in a process that did not ask for it."""
    return Trial(study, _trial_id_of(study, number))


def trial_by_number(study: optuna.Study, number: int) -> FrozenTrial:
    """Trial `number` as the storage has it now, without reading the whole study."""
    return storage_of(study).get_trial(_trial_id_of(study, number))


def _trial_id_of(study: optuna.Study, number: int) -> int:
    return storage_of(study).get_trial_id_from_study_id_trial_number(study._study_id, number)


def job_result(ret: JobReturn) -> tuple[object, BaseException | None]:
    """(return value, None) for a job that completed, (None, its exception) otherwise."""
    if ret.status == JobStatus.COMPLETED:
        return ret._return_value, None
    return None, ret._return_value


def hydra_deprecation_warning(message: str) -> None:
    """Hydra's deprecation warning: a UserWarning, or HydraDeprecationError where the
    environment sets HYDRA_DEPRECATION_WARNINGS_AS_ERRORS."""
    from hydra._internal.deprecation_warning import deprecation_warning

    deprecation_warning(message, stacklevel=3)


class _StudySeenAs(optuna.Study):
    """The same study (storage, id, cache, sampler) with its trials shown through `show`."""

    def __init__(self, study: optuna.Study, show: Callable[[list[FrozenTrial]], list[FrozenTrial]]):
        self.__dict__.update(study.__dict__)  # no Study.__init__: nothing is opened again
        self._show = show

    def _get_trials(
        self,
        deepcopy: bool = True,
        states: Container[TrialState] | None = None,
        use_cache: bool = False,
    ) -> list[FrozenTrial]:
        trials = self._show(super()._get_trials(deepcopy=False, states=None, use_cache=use_cache))
        if states is not None:
            trials = [t for t in trials if t.state in states]
        return copy.deepcopy(trials) if deepcopy else trials


def trials_seen_as(
    study: optuna.Study, show: Callable[[list[FrozenTrial]], list[FrozenTrial]]
) -> optuna.Study:
    return _StudySeenAs(study, show)


def retry_history(t: FrozenTrial) -> list[int]:
    """The trials t re-runs, first to last (empty for a trial that is not a re-queued copy)."""
    return list(t.system_attrs.get("retry_history", []))


def retry_attrs(t: FrozenTrial) -> dict[str, object]:
    """The system attrs of a re-queued copy of t."""
    history = [*retry_history(t), t.number]
    return {"failed_trial": history[0], "retry_history": history}


def sampler_constraints(values: list[float]) -> dict[str, object]:
    """The system attrs in which Optuna 4.x keeps a trial's `constraints_func` values."""
    from optuna.samplers._base import _CONSTRAINTS_KEY

    return {_CONSTRAINTS_KEY: list(values)}


def contains(dist: BaseDistribution, value: object) -> bool:
    """`value` lies in `dist` as Optuna checks it (ints exact and on the step, floats in the
    range and on the step within its tolerance, a categorical among the choices)."""
    try:
        return bool(dist._contains(dist.to_internal_repr(value)))
    except (ValueError, TypeError):
        return False
