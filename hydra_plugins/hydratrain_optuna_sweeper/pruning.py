"""The sweeper's pruners and search space as a study of this sweeper builds them, for tools
outside the sweep (`python -m app.bench --hpo` replays the pruners; `--hpo-peers` hands the
Trainer the same space). The seam the bench uses: nothing outside the sweeper imports its `_`
modules. Hydra's plugin scan imports this module: Optuna is imported only when used."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution, CategoricalChoiceType
    from optuna.pruners import BasePruner
    from optuna.trial import Trial


def study_pruner(
    name: str, args: Mapping[str, object], eval_every: int, max_steps: int
) -> BasePruner:
    """hpo.pruner=`name` with hpo.pruner_args=`args`, for trials that evaluate every
    `eval_every` optimizer steps up to `max_steps`: the defaults follow that schedule."""
    from ._pruners._kind import ReportAxis, build_pruner

    return build_pruner(name, args, 1, ReportAxis(every=eval_every, last=max_steps))


def study_pruner_arguments(
    name: str, args: Mapping[str, object], eval_every: int, max_steps: int
) -> dict[str, object]:
    """The arguments `study_pruner` passes to the pruner: hpo.pruner_args over the defaults
    that follow the schedule (for a peer built with Optuna's own class)."""
    from ._pruners._kind import ReportAxis, pruner_defaults

    return {**pruner_defaults(name, ReportAxis(every=eval_every, last=max_steps), args), **args}


def search_space(params: Mapping[str, str]) -> dict[str, BaseDistribution]:
    """`hydra.sweeper.params` ({key: expression}) as the Optuna distributions a trial samples,
    parsed as the sweeper parses them."""
    from ._study._space import Entry, parse_space

    entries = [Entry(f"hydra.sweeper.params.{k}", f"{k}={v}") for k, v in params.items()]
    return dict(parse_space(entries).distributions)


def suggest(trial: Trial, name: str, distribution: BaseDistribution) -> CategoricalChoiceType:
    """Sample `name` on an Optuna trial as the sweeper's worker does."""
    from ._study._space import suggest as sweeper_suggest

    return sweeper_suggest(trial, name, distribution)
