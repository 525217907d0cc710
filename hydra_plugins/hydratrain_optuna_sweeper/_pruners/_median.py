"""`hpo.pruner=median`: Optuna's median pruner, after 3 trials and past the untrained model."""

from __future__ import annotations

from collections.abc import Mapping

import optuna

from ._kind import PRUNERS, PrunerKind, ReportAxis


def _defaults(schedule: ReportAxis | None, args: Mapping[str, object]) -> dict[str, object]:
    return {"n_startup_trials": 3, "n_warmup_steps": 1}


PRUNERS.add(
    PrunerKind(
        "median",
        build=lambda args, schedule: optuna.pruners.MedianPruner(**args),  # type: ignore[arg-type]
        defaults=_defaults,
    )
)
