"""`hpo.pruner=median`: Optuna's median pruner, after 3 trials and past the untrained model."""

from __future__ import annotations

from collections.abc import Mapping

import optuna

from ._kind import PRUNERS, PrunerKind, ReportAxis


def _defaults(schedule: ReportAxis | None, args: Mapping[str, object]) -> dict[str, object]:
    # n_min_trials: as many reports at the step judged as the start-up's completed trials give
    # (the same thing for a study's own trials); a warm start's observed trials complete
    # without reports, so they cannot stand in for them.
    startup = args.get("n_startup_trials", 3)
    least = max(1, startup) if isinstance(startup, int) and not isinstance(startup, bool) else 1
    return {"n_startup_trials": 3, "n_warmup_steps": 1, "n_min_trials": least}


PRUNERS.add(
    PrunerKind(
        "median",
        build=lambda args, schedule: optuna.pruners.MedianPruner(**args),  # type: ignore[arg-type]
        defaults=_defaults,
        compares_reports=True,
    )
)
