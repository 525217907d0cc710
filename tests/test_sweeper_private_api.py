"""The sweeper's private uses of Optuna and Hydra (hydra_plugins/.../_private.py), each
exercised on every kind of storage, with the Optuna version installed here.

CI also runs this file (with tests/test_sweeper.py and tests/test_sweeper_budget.py) on
Optuna 4.x in a throwaway environment without torch: see .ci/run. It needs no conftest.
"""

from __future__ import annotations

import optuna
import pytest
from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import HydraDeprecationError
from optuna.trial import TrialState

from hydra_plugins.hydratrain_optuna_sweeper import _private as private

pytestmark = pytest.mark.unit

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(params=["memory", "journal", "sqlite"])
def study(request, tmp_path) -> optuna.Study:
    if request.param == "memory":
        storage = None
    elif request.param == "journal":
        from hydra_plugins.hydratrain_optuna_sweeper._study._storage import journal

        storage = journal(str(tmp_path / "s.journal"))
    else:
        storage = f"sqlite:///{tmp_path}/s.db"
    return optuna.create_study(study_name="s", storage=storage)


def test_system_and_user_attrs_on_a_running_trial(study):
    trial = study.ask()
    frozen = study.get_trials()[0]
    private.set_system_attr(study, frozen, "hpo:x", 1.5)  # through the FrozenTrial, too
    private.set_user_attr(study, trial, "reason", "stale")
    now = private.frozen(study, trial)
    assert now.system_attrs["hpo:x"] == 1.5 and now.user_attrs["reason"] == "stale"
    assert private.trial_id(trial) == private.trial_id(frozen)
    assert isinstance(private.storage_of(study), optuna.storages.BaseStorage)


def test_claiming_a_running_trial_as_failed_is_won_once(study):
    study.ask()
    frozen = study.get_trials()[0]
    assert private.claim_failed(study, frozen) is True
    assert private.claim_failed(study, frozen) is False  # the second claimant loses
    assert private.frozen(study, frozen).state == TrialState.FAIL


def test_a_live_trial_is_rebuilt_from_its_number(study):
    study.ask()
    trial = study.ask()
    live = private.live_trial(study, trial.number)
    live.report(2.0, 3)
    live.set_user_attr("k", "v")
    assert live.number == trial.number
    assert private.frozen(study, trial).intermediate_values == {3: 2.0}
    assert private.trial_by_number(study, trial.number).intermediate_values == {3: 2.0}


def test_finished_trials_refuse_updates_with_the_error_the_sweeper_catches(study):
    trial = study.ask()
    study.tell(trial.number, state=TrialState.FAIL)
    with pytest.raises(private.TrialFinished), private.finished_trial_guard():
        private.set_user_attr(study, trial, "reason", "late")
    with pytest.raises(private.TrialFinished), private.finished_trial_guard():
        trial.report(1.0, 1)
    with pytest.raises(RuntimeError, match="other"), private.finished_trial_guard():
        raise RuntimeError("other")  # anything else passes through
    assert study.tell(trial, 1.0, skip_if_finished=True).state == TrialState.FAIL


def test_a_waiting_copy_keeps_parameters_and_retry_history(study):
    from hydra_plugins.hydratrain_optuna_sweeper._study._shared import requeue

    trial = study.ask()
    trial.suggest_float("x", 0.0, 1.0)
    study.tell(trial, state=TrialState.FAIL)
    requeue(study, private.frozen(study, trial), {"resume_from": "/runs/0"})
    again = study.ask()
    assert again.suggest_float("x", 0.0, 1.0) == trial.params["x"]
    assert again.user_attrs["resume_from"] == "/runs/0"
    retried = optuna.storages.RetryFailedTrialCallback.retried_trial_number
    assert retried(private.frozen(study, again)) == trial.number


def test_a_jobs_value_or_exception():
    done = JobReturn(status=JobStatus.COMPLETED, _return_value=1.5)
    failed = JobReturn(status=JobStatus.FAILED, _return_value=RuntimeError("boom"))
    assert private.job_result(done) == (1.5, None)
    value, exc = private.job_result(failed)
    assert value is None and isinstance(exc, RuntimeError)


def test_hydras_deprecation_warning_warns_or_raises_as_the_environment_says(monkeypatch):
    monkeypatch.delenv("HYDRA_DEPRECATION_WARNINGS_AS_ERRORS", raising=False)
    with pytest.warns(UserWarning, match="^old key$"):
        private.hydra_deprecation_warning("old key")
    monkeypatch.setenv("HYDRA_DEPRECATION_WARNINGS_AS_ERRORS", "1")
    with pytest.raises(HydraDeprecationError, match="old key"):
        private.hydra_deprecation_warning("old key")


@pytest.mark.parametrize(
    "sampler",
    [
        lambda: optuna.samplers.TPESampler(seed=0, n_startup_trials=2),
        lambda: optuna.samplers.TPESampler(seed=0, n_startup_trials=2, constant_liar=True),
        lambda: optuna.samplers.RandomSampler(seed=0),
        lambda: optuna.samplers.NSGAIISampler(seed=0, population_size=2),
    ],
)
def test_a_sampler_reads_the_trials_a_study_seen_as_shows_it(study, sampler):
    """Every read a sampler makes (the private _get_trials, cached or not, get_trials and
    trials) goes through the function; the study's storage and its trials are untouched."""
    for x in (0.1, 0.2, 0.3):
        study.add_trial(
            optuna.trial.create_trial(
                params={"x": x},
                distributions={"x": optuna.distributions.FloatDistribution(0, 1)},
                value=x,
            )
        )
    calls = []

    def first_two(trials):
        calls.append(len(trials))
        return trials[:2]

    seen = private.trials_seen_as(study, first_two)
    assert [t.value for t in seen.trials] == [0.1, 0.2]
    assert len(seen.get_trials(states=(TrialState.COMPLETE,))) == 2
    assert len(seen._get_trials(deepcopy=False, use_cache=True)) == 2
    s = sampler()
    trial = study.ask()
    frozen = private.frozen(study, trial)
    space = s.infer_relative_search_space(seen, frozen)
    s.sample_relative(seen, frozen, space)
    value = s.sample_independent(seen, frozen, "x", optuna.distributions.FloatDistribution(0, 1))
    assert 0 <= value <= 1 and calls
    assert len(study.trials) == 4 and seen.study_name == study.study_name


@pytest.mark.skipif(
    hasattr(optuna.trial.Trial, "set_constraint"), reason="Optuna >= 5: constraints on the trial"
)
def test_a_trial_added_finished_carries_the_constraints_a_sampler_reads(study):
    """Optuna 4.x: what a constraints_func sampler stores after a trial it told, written on one
    added finished: TPE then reads it as a told trial's (without it: "Trial N does not have
    constraint values", and the trial is ranked below every other)."""
    import warnings

    from optuna.distributions import FloatDistribution

    dist = {"x": FloatDistribution(0.0, 1.0)}
    for x in (0.1, 0.5, 0.9):
        trial = optuna.trial.create_trial(
            params={"x": x}, distributions=dist, value=x,
            system_attrs=private.sampler_constraints([0.0]),
        )  # fmt: skip
        study.add_trial(trial)
    sampler = optuna.samplers.TPESampler(
        n_startup_trials=1, seed=0, constraints_func=lambda t: [0.0]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "does not have constraint values" would raise here
        sampler.sample_independent(study, study.ask(), "x", dist["x"])
