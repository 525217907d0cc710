"""What a study spends: device-seconds (train + eval time x devices, the summary's
`device_seconds`), recorded per trial as a user attribute.

- `hpo.budget_s` caps the whole study: before each trial is handed out, the workers (whatever
  their number, on one storage) add up what the finished trials recorded; at the cap no trial
  is asked for or promoted. Running trials finish, so a study may pass its cap by what they
  spend after the last check.
- `device_seconds` as an objective (`hpo.metric=[final_val_loss, device_seconds]`) is what the
  configuration cost: a promoted or resumed trial adds what the earlier trials of its line
  spent to its own job's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import optuna
from optuna.trial import FrozenTrial

from ._lineage import root

log = logging.getLogger(__name__)

COST = "device_seconds"  # the summary key, user attr and objective name


def recorded(t: FrozenTrial) -> float:
    value = t.user_attrs.get(COST)
    return float(value) if isinstance(value, int | float) and value == value else 0.0


def total(trials: Iterable[FrozenTrial]) -> float:
    return sum(recorded(t) for t in trials)


class CostCap:
    """hpo.budget_s: the device-seconds the study may spend, shared by its workers."""

    def __init__(self, study: optuna.Study, budget_s: float) -> None:
        self.study = study
        self.budget_s = budget_s
        self._said = False

    def spent(self) -> bool:
        used = total(self.study.get_trials(deepcopy=False))
        if used < self.budget_s:
            return False
        if not self._said:
            log.info(
                "hpo.budget_s=%g spent (%.1f device-seconds recorded): no more trials",
                self.budget_s,
                used,
            )
            self._said = True
        return True


def line_cost(study: optuna.Study, trial: FrozenTrial, own: float) -> float:
    """What trial's configuration cost: `own` (its job's) and what the other trials of its
    line recorded."""
    line = root(trial)
    others = [
        t for t in study.get_trials(deepcopy=False) if root(t) == line and t.number != trial.number
    ]
    return own + total(others)
