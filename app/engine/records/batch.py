"""summary.json's `batch_details`, typed: how training.micro_batch_size=auto chose (the probe's
report, with a row per micro-batch it tried) and the out-of-memory errors that changed the plan.

The file keeps one flat mapping (the probe's keys beside the OOMs'); `BatchDetails` is the one
place that writes it and reads it back, so the probe, the OOM recovery, the run's report and
the GPU suite share a type, not a set of keys.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.core.json_types import Json


@dataclass(frozen=True)
class Candidate:
    """One micro-batch the probe tried: whether it fits under the memory limit, whether it ran
    out of memory, the share of the device's memory it peaked at, its speed."""

    micro: int
    fits: bool
    oom: bool = False
    peak_fraction: float | None = None
    samples_per_sec: float | None = None


@dataclass(frozen=True)
class ProbeReport:
    """How training.micro_batch_size=auto chose: what probing cost (0 from the cache), the
    sizes tried, the memory limit they were held to, the rule that chose, the cache file. With
    torch.compile on, the compiled confirmation of the chosen size: its seconds (mostly
    compiling the graphs the run keeps, which its first step would pay otherwise, so not in
    probe_seconds) and the graphs it compiled; None when the run does not compile or the plan
    came from the cache."""

    probe_seconds: float
    probe_steps: int
    chosen_by: str
    memory_limit_fraction: float
    candidates: list[Candidate]
    cache: str | None
    confirm_seconds: float | None = None
    graphs_compiled: int | None = None

    def fastest_fitting(self, largest: int) -> float | None:
        """The best samples/s of a micro-batch that fits and is at most `largest`."""
        speeds = [
            c.samples_per_sec
            for c in self.candidates
            if c.fits and c.samples_per_sec and c.micro <= largest
        ]
        return max(speeds) if speeds else None


@dataclass(frozen=True)
class OomRecord:
    """The run's out-of-memory errors: how many, the allocator's retries before them (CUDA
    only), the step the last one struck at and the micro-batch it struck."""

    count: int = 0
    alloc_retries: int | None = None
    at_step: int | None = None
    reduced_from: int | None = None


# OomRecord's fields as summary.json names them (none is written before the first OOM).
_OOM_KEYS = {
    "count": "oom_count",
    "alloc_retries": "alloc_retries",
    "at_step": "oom_at_step",
    "reduced_from": "reduced_from",
}


@dataclass(frozen=True)
class BatchDetails:
    """The probe's report (None: the micro-batch was set) and the OOMs."""

    probe: ProbeReport | None = None
    ooms: OomRecord = field(default_factory=OomRecord)

    def to_json(self) -> dict[str, Json]:
        out: dict[str, Json] = {}
        if self.probe is not None:
            out.update(dataclasses.asdict(self.probe))
        if self.ooms.count:
            named = {key: getattr(self.ooms, name) for name, key in _OOM_KEYS.items()}
            out.update({k: v for k, v in named.items() if v is not None})
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BatchDetails:
        """summary.json's batch_details read back."""
        probe = None
        if "chosen_by" in data:  # a key of the probe's since its first version
            names = {f.name for f in dataclasses.fields(Candidate)}
            rows = [
                Candidate(**{k: v for k, v in r.items() if k in names})
                for r in data.get("candidates") or []
            ]
            probe = ProbeReport(
                probe_seconds=float(data.get("probe_seconds") or 0.0),
                probe_steps=int(data.get("probe_steps") or 0),
                chosen_by=str(data["chosen_by"]),
                memory_limit_fraction=float(data.get("memory_limit_fraction") or 0.0),
                candidates=rows,
                cache=data.get("cache"),
                confirm_seconds=data.get("confirm_seconds"),  # absent before compiled probes
                graphs_compiled=data.get("graphs_compiled"),
            )
        ooms = OomRecord(**{n: data[k] for n, k in _OOM_KEYS.items() if k in data})
        return cls(probe, ooms)
