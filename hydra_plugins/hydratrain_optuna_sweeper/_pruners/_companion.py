"""Pruning with several objectives: the pruner judges `hpo.report_metric`.

Optuna refuses `Trial.report` in a multi-objective study, and its pruners read one direction.
So each trial of such a study gets a companion trial in a single-objective study of the same
storage, `<study>:<report_metric>` (direction: the report metric's own), which takes the trial's
reports and whose pruner (hpo.pruner, built as for one objective) decides. The main study keeps
its own trials untouched: its Pareto front comes from its completed trials alone. In Optuna's
tools the companion is a study of its own; its trials carry system attrs `hpo:main_trial`
(the main trial's number) and `hpo:root`, and the main trial carries `hpo:report_trial`. A
companion trial ends as its main trial did (COMPLETE with its last report).

With one objective the study is its own judge: `Judge` hides the difference.
"""

from __future__ import annotations

import logging

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from .. import _private as private
from ._lineage import ROOT, root

log = logging.getLogger(__name__)

REPORT_TRIAL = "hpo:report_trial"  # on a main trial: its companion trial's number
MAIN_TRIAL = "hpo:main_trial"  # on a companion trial: its main trial's number


def companion_name(study_name: str, metric: str) -> str:
    return f"{study_name}:{metric}"


def open_companion(
    main: optuna.Study, metric: str, direction: str, pruner: optuna.pruners.BasePruner
) -> optuna.Study:
    """The companion study of `main` (created once), with `pruner` to judge its reports."""
    return optuna.create_study(
        study_name=companion_name(main.study_name, metric),
        storage=private.storage_of(main),
        sampler=optuna.samplers.RandomSampler(),  # never samples: it has no parameters
        pruner=pruner,
        direction="maximize" if direction == "maximize" else "minimize",
        load_if_exists=True,
    )


def load_companion(
    main: optuna.Study, metric: str, pruner: optuna.pruners.BasePruner
) -> optuna.Study:
    """The companion, from a job's process (it exists: the worker made it)."""
    return optuna.load_study(
        study_name=companion_name(main.study_name, metric),
        storage=private.storage_of(main),
        sampler=optuna.samplers.RandomSampler(),
        pruner=pruner,
    )


def report_trial(main_trial: Trial, companion: optuna.Study) -> Trial | None:
    """The live companion trial of `main_trial`, None when it has none."""
    number = private.frozen(main_trial.study, main_trial).system_attrs.get(REPORT_TRIAL)
    return None if number is None else private.live_trial(companion, int(number))


class Judge:
    """Where a study's trials report and its pruner decides: the study itself, or (several
    objectives) its companion."""

    def __init__(self, main: optuna.Study, companion: optuna.Study | None = None) -> None:
        self.main = main
        self.companion = companion

    @property
    def study(self) -> optuna.Study:
        return self.companion if self.companion is not None else self.main

    def pair(self, trial: Trial) -> Trial | None:
        """The trial that takes `trial`'s reports (asked now in the companion); None where
        nothing judges them (several objectives, no pruner)."""
        if self.companion is None:
            return trial if len(self.main.directions) == 1 else None
        self._settle_orphans()
        twin = self.companion.ask()
        private.set_system_attr(self.companion, twin, MAIN_TRIAL, trial.number)
        private.set_system_attr(self.companion, twin, ROOT, root(private.frozen(self.main, trial)))
        private.set_system_attr(self.main, trial, REPORT_TRIAL, twin.number)
        return twin

    def settle(self, trial: Trial | FrozenTrial, state: TrialState) -> None:
        """End the companion trial of `trial` as `trial` ended."""
        if self.companion is None:
            return
        number = private.frozen(self.main, trial).system_attrs.get(REPORT_TRIAL)
        if number is not None:
            self._end(int(number), state)

    def _end(self, number: int, state: TrialState) -> None:
        assert self.companion is not None
        twin = private.trial_by_number(self.companion, number)
        if twin.state.is_finished():
            return
        last = twin.intermediate_values.get(twin.last_step) if twin.last_step is not None else None
        try:
            with private.finished_trial_guard():
                if state == TrialState.COMPLETE and last is not None:
                    self.companion.tell(number, last)
                else:
                    done = state if state != TrialState.COMPLETE else TrialState.FAIL
                    self.companion.tell(number, state=done)
        except private.TrialFinished:
            pass  # another worker ended it meanwhile

    def _settle_orphans(self) -> None:
        """Companion trials whose main trial ended elsewhere (failed as stale) end too."""
        assert self.companion is not None
        running = self.companion.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if not running:
            return
        mains = {t.number: t for t in self.main.get_trials(deepcopy=False)}
        for twin in running:
            main = mains.get(int(twin.system_attrs.get(MAIN_TRIAL, -1)))
            if main is not None and main.state.is_finished():
                self._end(twin.number, main.state)
