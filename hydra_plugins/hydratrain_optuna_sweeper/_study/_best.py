"""A study's best among its own trials: what study.best_trial and study.best_trials give
(the feasible trials first, by Optuna's constraints), where the study also holds trials
borrowed from earlier studies (hpo.warm_start) that must not count."""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial


def own_best(study: optuna.Study, complete: list[FrozenTrial]) -> FrozenTrial:
    """study.best_trial among `complete` (a study that observed borrowed trials: its own)."""
    sign = -1.0 if study.direction == optuna.study.StudyDirection.MAXIMIZE else 1.0
    kept = [t for t in complete if feasible(t)] or complete
    return min(kept, key=lambda t: sign * float(t.value))  # type: ignore[arg-type]


def own_front(study: optuna.Study, complete: list[FrozenTrial]) -> list[FrozenTrial]:
    """study.best_trials among `complete`: the feasible trials no other one dominates."""
    signs = [-1.0 if d == optuna.study.StudyDirection.MAXIMIZE else 1.0 for d in study.directions]
    points = {t.number: [s * v for s, v in zip(signs, t.values, strict=True)] for t in complete}
    kept = [t for t in complete if feasible(t)]

    def dominated(a: list[float]) -> bool:
        return any(
            all(x <= y for x, y in zip(points[o.number], a, strict=True)) and points[o.number] != a
            for o in kept
        )

    return [t for t in kept if not dominated(points[t.number])]


def feasible(t: FrozenTrial) -> bool:
    """No constraint above zero (Optuna >= 5 records them; an OOM trial is infeasible)."""
    constraints = getattr(t, "constraints", None) or {}
    values = constraints.values() if isinstance(constraints, dict) else constraints
    return all(v <= 0 for v in values)
