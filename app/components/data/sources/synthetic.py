"""`data.source=synthetic`: uniform random tokens (`data.synthetic_num_tokens`), nothing to
learn: for throughput measurements."""

from __future__ import annotations

from app.components.data.kinds import TEXT
from app.components.data.sources import SOURCES, DataSource

# Random token ids stand in for tokenized text.
SOURCES.add(DataSource("synthetic", gives=(TEXT,)))
