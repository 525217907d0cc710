"""`hpo.pruner=none`: every trial runs its whole budget; nothing judges the reports."""

from __future__ import annotations

import optuna

from ._kind import PRUNERS, PrunerKind

PRUNERS.add(
    PrunerKind("none", build=lambda args, schedule: optuna.pruners.NopPruner(), judges=False)
)
