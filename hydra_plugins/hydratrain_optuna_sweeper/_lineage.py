"""Lines of trials: one configuration run as several Optuna trials.

A preempted or stale trial is re-queued as a new trial (`_study.requeue`), and a paused trial
is promoted as a new one (`_asha.py`): each copy resumes the same configuration. The line's root
is its first trial; a rung counts a line once, and its cost is what all its trials spent.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from optuna.trial import FrozenTrial

ROOT = "hpo:root"  # system attr: the number of the line's first trial
PROMOTED_FROM = "hpo:promoted_from"  # system attr of a promoted copy: the paused trial


def root(t: FrozenTrial) -> int:
    """The number of the first trial of t's line (t's own when it is the first)."""
    if ROOT in t.system_attrs:
        return int(t.system_attrs[ROOT])
    history = t.system_attrs.get("retry_history")  # re-queued copies, as Optuna records them
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


def copy_attrs(t: FrozenTrial) -> dict[str, Any]:
    """The system attrs a copy of t carries to stay in t's line."""
    attrs: dict[str, Any] = {ROOT: root(t)}
    if promoted(t):
        attrs[PROMOTED_FROM] = t.system_attrs[PROMOTED_FROM]
    return attrs
