"""`hpo.pruner=successive_halving` (the default): Optuna's, its first rung placed for the
study's schedule (`_kind.halving_defaults`), its promotions waiting for a few trials at a rung
in a study large enough to afford it (`bootstrap`)."""

from __future__ import annotations

import optuna

from ._kind import PRUNERS, PrunerKind, halving_defaults

# Optuna's bootstrap_count: a trial is promoted from a rung only once more than this many have
# reached it (the first ones there are stopped). Optuna's default, 0, promotes the first trial
# at each rung whatever its value: on the default study (20 trials' worth, two seeds) 2 brought
# the study within 1 % of the unpruned study's best in 282 and 643 s instead of 646 and 1,022 s
# (docs/benchmarks.md, "The default study against a grid", "As shipped").
BOOTSTRAP_COUNT = 2
# A study of fewer trials (or trials' worth) keeps Optuna's 0: with 2, no trial completes
# before the fifth, and a short study may end with none.
BOOTSTRAP_FROM = 10


def bootstrap(trials: float | None) -> dict[str, object]:
    """The bootstrap count for a study of `trials` trials (None: no bound)."""
    if trials is not None and trials < BOOTSTRAP_FROM:
        return {}
    return {"bootstrap_count": BOOTSTRAP_COUNT}


PRUNERS.add(
    PrunerKind(
        "successive_halving",
        build=lambda args, schedule: optuna.pruners.SuccessiveHalvingPruner(**args),  # type: ignore[arg-type]
        defaults=halving_defaults,
        budget_defaults=bootstrap,
    )
)
