"""`hpo.pruner=successive_halving` (the default): Optuna's, its first rung placed for the
study's schedule (`_kind.halving_defaults`)."""

from __future__ import annotations

import optuna

from ._kind import PRUNERS, PrunerKind, halving_defaults

PRUNERS.add(
    PrunerKind(
        "successive_halving",
        build=lambda args, schedule: optuna.pruners.SuccessiveHalvingPruner(**args),  # type: ignore[arg-type]
        defaults=halving_defaults,
    )
)
