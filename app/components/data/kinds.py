"""What samples a data source gives and a task reads.

A task names the kind it reads (`Task.reads`); a data source names the kinds it gives
(`DataSource.gives`). The check that a source serves a task compares the two, so a new task or
source declares its own and edits neither the other nor a list of names. A new kind is one more
constant, here or in the module that introduces it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SampleKind:
    name: str  # as messages name it: "labelled text"


TEXT = SampleKind("text")  # documents, tokenized into one stream (or token ids already)
LABELLED_TEXT = SampleKind("labelled text")  # single texts or text pairs, each with a label
