"""`hpo.pruner=hyperband`: Optuna's, its brackets spanning the first evaluation to the budget."""

from __future__ import annotations

from collections.abc import Mapping

import optuna

from ._kind import PRUNERS, PrunerKind, ReportAxis, reduction_factor


def _defaults(schedule: ReportAxis | None, args: Mapping[str, object]) -> dict[str, object]:
    out: dict[str, object] = {"reduction_factor": reduction_factor(args)}
    if schedule is None:
        return out
    return {
        **out,
        "min_resource": schedule.every,
        "max_resource": max(schedule.last, schedule.every),
    }


PRUNERS.add(
    PrunerKind(
        "hyperband",
        build=lambda args, schedule: optuna.pruners.HyperbandPruner(**args),  # type: ignore[arg-type]
        defaults=_defaults,
    )
)
