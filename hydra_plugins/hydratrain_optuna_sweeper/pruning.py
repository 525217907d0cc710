"""The sweeper's pruners as a study of this sweeper builds them, for tools outside the sweep
(`python -m app.bench --hpo` replays them). Hydra's plugin scan imports this module: Optuna is
imported only when a pruner is built."""

from __future__ import annotations

from typing import Any


def study_pruner(name: str, args: dict[str, Any], eval_every: int, max_steps: int) -> Any:
    """hpo.pruner=`name` with hpo.pruner_args=`args`, for trials that evaluate every
    `eval_every` optimizer steps up to `max_steps`: the defaults follow that schedule."""
    from ._samplers import EvalSchedule, build_pruner

    return build_pruner(name, args, 1, EvalSchedule(every=eval_every, last=max_steps))


def study_pruner_arguments(
    name: str, args: dict[str, Any], eval_every: int, max_steps: int
) -> dict[str, Any]:
    """The arguments `study_pruner` passes to the pruner: hpo.pruner_args over the defaults
    that follow the schedule (for a peer built with Optuna's own class)."""
    from ._samplers import EvalSchedule, pruner_defaults

    return {**pruner_defaults(name, EvalSchedule(every=eval_every, last=max_steps), args), **args}
