"""`hpo.pruner=successive_halving` (the default): Optuna's, its first rung placed for the
study's schedule (`_kind.halving_defaults`), its promotions waiting for a few trials at a rung
in a study whose budget in trials' worth affords it (`bootstrap`), except for a configuration
borrowed from an earlier study (`WarmSuccessiveHalvingPruner`)."""

from __future__ import annotations

import optuna

from ._kind import PRUNERS, PrunerKind, ReportAxis, halving_defaults
from ._lineage import BORROWED_FROM

# Optuna's bootstrap_count: a trial is promoted from a rung only once more than this many have
# reached it (the first ones there are stopped). Optuna's default, 0, promotes the first trial
# at each rung whatever its value: on the default study (20 trials' worth, two seeds) 2 brought
# the study within 1 % of the unpruned study's best in 282 and 643 s instead of 646 and 1,022 s
# (docs/benchmarks.md, "The default study against a grid", "As shipped").
BOOTSTRAP_COUNT = 2
# Only under a budget in trials' worth of at least this many (hpo.budget_trials, the default
# study's 20), where the trials it stops early buy more trials. A count (hpo.n_trials) keeps
# Optuna's 0: with 2 no trial completes before the fifth, and only one that is the best so far
# at every rung completes at all, so a count of 10 random trials can end with none completed.
BOOTSTRAP_FROM = 10


def bootstrap(worth: float | None, schedule: ReportAxis | None) -> dict[str, object]:
    """The bootstrap count for a study of `worth` full trials' worth (None: a count of trials).
    A study whose schedule is learned (`schedule` None) places its rungs as a declared one
    once it knows it (`_learned.py`), so it takes the same bootstrap."""
    if worth is None or worth < BOOTSTRAP_FROM:
        return {}
    return {"bootstrap_count": BOOTSTRAP_COUNT}


class WarmSuccessiveHalvingPruner(optuna.pruners.SuccessiveHalvingPruner):
    """Optuna's successive halving, but a configuration borrowed from an earlier study
    (hpo.warm_start's enqueue, which runs them first) is judged without the bootstrap.

    The bootstrap stops the first trials to reach a rung because nothing there can tell a good
    one yet: right for random configurations, wrong for the earlier study's best, which would
    all be spent as the bootstrap (the warm-start benchmark's first run: its five borrowed
    configurations pruned, none completed). A borrowed trial goes on where it is the best at
    its rung so far (Optuna's rule for fewer than reduction_factor trials there) or among the
    top 1/reduction_factor; once they have reached a rung, the trials after them have
    something to be compared with.
    """

    def __init__(self, **args: object) -> None:
        super().__init__(**args)  # type: ignore[arg-type]
        self._borrowed = optuna.pruners.SuccessiveHalvingPruner(
            **{**args, "bootstrap_count": 0}  # type: ignore[arg-type]
        )

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        if BORROWED_FROM in trial.user_attrs:
            return self._borrowed.prune(study, trial)
        return super().prune(study, trial)


PRUNERS.add(
    PrunerKind(
        "successive_halving",
        build=lambda args, schedule: WarmSuccessiveHalvingPruner(**args),
        defaults=halving_defaults,
        budget_defaults=bootstrap,
    )
)
