"""`data.source=synthetic`: uniform random tokens (`data.synthetic_num_tokens`), nothing to
learn: for throughput measurements."""

from __future__ import annotations

from app.components.data.sources import SOURCES, DataSource

SOURCES.add(DataSource("synthetic", tasks=("causal_lm",)))
