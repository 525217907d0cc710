"""What a model computes on top of its body: what a task trains and a model family builds.

A task names the head it needs (`Task.head`); a family names the heads it builds from `model.*`
sizes (`ModelFamily.heads`). The check that a model fits a task compares the two, so a new task
or family declares its own and edits neither the other nor a list of names. A new kind of head
is one more constant, here or in the module of the task that introduces it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Head:
    name: str
    noun: str  # what a model with it is called in messages: "a causal LM"


CAUSAL_LM = Head("causal LM", "a causal LM")  # next-token logits over the vocabulary
SEQUENCE_CLASSIFIER = Head("sequence classification", "a classifier")  # one label per sample
