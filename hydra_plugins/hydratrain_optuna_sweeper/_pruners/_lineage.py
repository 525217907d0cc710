"""Lines of trials: one configuration run as several Optuna trials.

A preempted or stale trial is re-queued as a new trial (`_shared.requeue`), and a paused trial
is promoted as a new one (`_asha.py`): each copy resumes the same configuration. The line's root
is its first trial; a rung counts a line once, and its cost is what all its trials spent, and
the sampler sees it once (`observations`): one configuration, one point of evidence.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

from optuna.trial import FrozenTrial, TrialState

from .. import _private as private

ROOT = "hpo:root"  # system attr: the number of the line's first trial
PROMOTED_FROM = "hpo:promoted_from"  # system attr of a promoted copy: the paused trial
# System attr of a trial that holds no slot of hpo.n_trials: a promoted copy (its paused trial
# holds it), a preempted trial (its re-queued copy does).
UNCOUNTED = "hpo:uncounted"
# User attr of a configuration borrowed from an earlier study (hpo.warm_start's enqueue):
# "<study>#<trial number>". Its re-queued copies carry it too.
BORROWED_FROM = "warm_start_from"


def root(t: FrozenTrial) -> int:
    """The number of the first trial of t's line (t's own when it is the first)."""
    if ROOT in t.system_attrs:
        return int(t.system_attrs[ROOT])
    history = private.retry_history(t)  # re-queued copies, as Optuna records them
    return int(history[0]) if history else t.number


def heads(trials: Iterable[FrozenTrial]) -> dict[int, FrozenTrial]:
    """Each line's newest trial, by root."""
    out: dict[int, FrozenTrial] = {}
    for t in trials:
        r = root(t)
        if r not in out or t.number > out[r].number:
            out[r] = t
    return out


def promoted(t: FrozenTrial) -> bool:
    """A promoted copy, or a re-queued copy of one: the paused trial holds the slot."""
    return PROMOTED_FROM in t.system_attrs


def copy_attrs(t: FrozenTrial) -> dict[str, object]:
    """The system attrs a copy of t carries to stay in t's line."""
    attrs: dict[str, object] = {ROOT: root(t)}
    if promoted(t):
        attrs[PROMOTED_FROM] = t.system_attrs[PROMOTED_FROM]
    return attrs


# The states a sampler learns from: what a line's trials say about its configuration.
OBSERVED = (TrialState.COMPLETE, TrialState.PRUNED)


def observations(trials: Iterable[FrozenTrial]) -> list[FrozenTrial]:
    """The trials as a sampler should see them: one per line, in number order.

    A line of several trials (a paused trial and its promotion, a preempted trial and its
    re-queued copy) is one configuration: it is shown as its root, the trial the sampler
    sampled (its number and its own system attrs: relative parameters, generations, sample
    ids), carrying the line's furthest result (COMPLETE over PRUNED, then the last step
    reached). Seen trial by trial, a configuration paused at a rung and completed later counts
    twice, once as a poor pruned point: TPE then both favours and avoids it.
    """
    lines: dict[int, list[FrozenTrial]] = {}
    for t in trials:
        lines.setdefault(root(t), []).append(t)
    out = [_observation(sorted(line, key=lambda t: t.number)) for line in lines.values()]
    return sorted(out, key=lambda t: t.number)


def _observation(line: list[FrozenTrial]) -> FrozenTrial:
    first = line[0]
    if len(line) == 1:
        return first
    finished = [t for t in line if t.state in OBSERVED]
    furthest = max(finished, key=_progress) if finished else line[-1]
    if furthest is first:
        return first
    seen = copy.copy(first)
    seen.state = furthest.state
    seen.values = furthest.values
    seen.intermediate_values = furthest.intermediate_values
    seen.datetime_complete = furthest.datetime_complete
    # Feasibility is the furthest run's (an OOM in a promotion makes the configuration infeasible).
    constraints = {k: v for k, v in furthest.system_attrs.items() if k.startswith("constraints")}
    seen.system_attrs = {**first.system_attrs, **constraints}
    return seen


def _progress(t: FrozenTrial) -> tuple[bool, int, int]:
    return (t.state == TrialState.COMPLETE, -1 if t.last_step is None else t.last_step, t.number)
