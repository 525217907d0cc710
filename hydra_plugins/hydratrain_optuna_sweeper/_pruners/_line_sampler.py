"""The sampler of an asha study: the user's sampler, shown one observation per line.

A paused trial ends PRUNED with its rung value and its promotion is a new trial of the same
parameters (`_asha.py`), so a configuration that went on to complete would reach the sampler
two or three times, once as a poor pruned point. `LineSampler` hands its sampler a view of the
study in which each line is one trial with its furthest result (`_lineage.observations`);
everything else (the storage, the seed, what the sampler writes) is the study's own.
"""

from __future__ import annotations

from collections.abc import Sequence

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from .. import _private as private
from ._lineage import observations


class LineSampler(optuna.samplers.BaseSampler):
    def __init__(self, inner: optuna.samplers.BaseSampler) -> None:
        self.inner = inner

    def _seen(self, study: optuna.Study) -> optuna.Study:
        return private.trials_seen_as(study, observations)

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return self.inner.infer_relative_search_space(self._seen(study), trial)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, object]:
        return self.inner.sample_relative(self._seen(study), trial, search_space)

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> object:
        seen = self._seen(study)
        return self.inner.sample_independent(seen, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.inner.before_trial(self._seen(study), trial)

    def after_trial(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        self.inner.after_trial(self._seen(study), trial, state, values)

    def reseed_rng(self) -> None:
        self.inner.reseed_rng()


def unwrapped(sampler: optuna.samplers.BaseSampler) -> optuna.samplers.BaseSampler:
    """The user's sampler, inside a LineSampler or not."""
    return sampler.inner if isinstance(sampler, LineSampler) else sampler
