"""What a run leaves in summary.json, as one typed record.

The runner fills a `Summary` as the run goes (the plan at start, results as they come, the
status at the end) and writes it once from `to_json()`. Task metrics are flattened to
`initial_val_<metric>` / `final_val_<metric>` (Metric.initial / Metric.final) and the task's own
facts (label names) sit beside the rest, so the file keeps one flat mapping. A result that was
never produced (no export, no MFU on an unknown device) is left out rather than written as null.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict, TypeVar

from app.core.json_types import Json
from app.core.outcomes import Status
from app.engine.records.batch import BatchDetails

_OPTIONAL = "optional"
OPTIONAL = {_OPTIONAL: True}  # a result left out of summary.json while it is None

V = TypeVar("V")


class ProfileWindow(TypedDict):
    """The optimizer steps the profiler recorded, [first, end), and where its trace is."""

    steps: list[int]
    trace_dir: str


@dataclass
class Summary:
    status: str = Status.RUNNING.value
    run_dir: str = ""
    error: str | None = field(default=None, metadata=OPTIONAL)
    # The plan, known once the run is built
    task: str | None = None
    device: str | None = None
    device_name: str | None = None
    preset: str | None = None
    device_memory_bytes: int | None = None
    # gpu.memory_limit_gib: the cap this run's process was held to (a GPU trials share)
    memory_limit_bytes: int | None = field(default=None, metadata=OPTIONAL)
    dtype: str | None = None
    precision_reason: str | None = None
    world_size: int = 1
    parallelism: str | None = None  # training.parallelism: ddp | fsdp
    seq_len: int | None = None
    tokens_per_step: int | None = None  # causal LM: exact; padded tasks: the most a step holds
    num_params: int | None = None
    flops_per_token: int | None = None
    peak_tflops: float | None = None
    resumed_from_step: int = 0
    warnings: list[str] = field(default_factory=list)
    micro_batch_size: int | None = None
    micro_batch_sizes: list[int] = field(default_factory=list)
    grad_accum_steps: int | None = None
    effective_batch_size: int | None = None
    eval_micro_batch_size: int | None = None
    batch_source: str | None = None
    batch_details: BatchDetails = field(default_factory=BatchDetails)  # BatchPlan.details
    task_fields: dict[str, Json] = field(default_factory=dict)  # the task's own (label names)
    # The budget (app/config/budget.py): where the steps came from, and the learning rate
    budget_setting: str | None = None  # training.max_steps | max_samples | max_tokens
    budget: int | None = None  # in budget_unit
    budget_unit: str | None = None  # steps | samples | tokens: the study's report axis
    max_steps: int | None = None  # derived from a data budget and the effective batch
    warmup_steps: float | None = None  # fractional where the warm-up's data is uneven
    lr: float | None = None  # training.lr scaled by lr_scaling for this batch
    lr_scaling: str | None = None
    lr_reference_batch: int | None = None
    # Progress and results
    steps: int = 0
    samples_seen: int = 0  # all ranks together
    tokens_seen: int | None = field(default=None, metadata=OPTIONAL)  # packed samples only
    initial_val: dict[str, float | None] = field(default_factory=dict)  # by metric name
    final_val: dict[str, float | None] = field(default_factory=dict)
    final_train_loss: float | None = field(default=None, metadata=OPTIONAL)
    tokens_per_sec: float | None = None  # steady state: the first log window left out
    train_time_s: float = 0.0
    eval_time_s: float | None = field(default=None, metadata=OPTIONAL)
    evaluations: int | None = field(default=None, metadata=OPTIONAL)
    profile: ProfileWindow | None = field(default=None, metadata=OPTIONAL)
    peak_memory_bytes: int | None = None
    peak_memory_fraction: float | None = field(
        default=None, metadata=OPTIONAL
    )  # CUDA: of the device's memory
    # Rank 0's parameters, gradients and optimizer state in bytes (FSDP: its shards): expected
    # at start, measured after the first optimizer step; and every rank's total and peak.
    model_state_bytes: dict[str, int] = field(default_factory=dict)
    model_state_bytes_per_rank: list[int] | None = field(default=None, metadata=OPTIONAL)
    peak_memory_bytes_per_rank: list[int] | None = field(default=None, metadata=OPTIONAL)
    oom_count: int = 0
    mfu: float | None = field(default=None, metadata=OPTIONAL)
    # training.noise_scale: the smoothed gradient noise scale B_simple in samples at the last
    # log point, the critical batch size it predicts (McCandlish et al. 2018)
    noise_scale: float | None = field(default=None, metadata=OPTIONAL)
    # training.batch_schedule=adaptive: the effective batch over the run, one {step, samples,
    # batch} per phase (the step and the samples seen where that batch began)
    batch_schedule: list[dict[str, int]] | None = field(default=None, metadata=OPTIONAL)
    # The probe's samples/s for this effective batch: its fastest micro-batch that fits in a
    # rank's share, times the ranks (the batch-size study's throughput per batch)
    probe_samples_per_sec: float | None = field(default=None, metadata=OPTIONAL)
    wall_time_s: float | None = None
    # With torch.compile on: the graphs dynamo compiled in this run, the probe's included
    # (app/components/models/compiling.py: one for training and one for evaluation)
    compiled_graphs: int | None = field(default=None, metadata=OPTIONAL)
    # What the run cost: (train_time_s + eval_time_s) x world_size; hpo.budget_s sums it
    device_seconds: float | None = None
    export_dir: str | None = field(default=None, metadata=OPTIONAL)

    @property
    def largest_peak_bytes(self) -> int | None:
        """The largest rank's peak memory (one rank: the run's): what each GPU of the run held
        at most, as a sweep that shares GPUs sizes its trials."""
        return max(self.peak_memory_bytes_per_rank or [0]) or self.peak_memory_bytes

    def device_line(self) -> str:
        """The banner's device line, printed at start (app/engine/report.py) and looked for
        by the GPU suite: one format for both."""
        mem = f", {self.device_memory_bytes / 2**30:.1f} GiB" if self.device_memory_bytes else ""
        if self.memory_limit_bytes is not None:
            mem += f", this run capped at {self.memory_limit_bytes / 2**30:.2f} GiB (shared)"
        return f"device     {self.device}: {self.device_name}{mem} (preset {self.preset})"

    def precision_line(self) -> str:
        """The banner's precision line: the dtype and why it was chosen for this device."""
        return f"precision  {self.dtype}: {self.precision_reason}"

    def to_json(self) -> dict[str, Json]:
        """The flat mapping summary.json holds."""
        out: dict[str, Json] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("initial_val", "final_val", "task_fields"):
                continue
            if value is None and f.metadata.get(_OPTIONAL):
                continue
            if isinstance(value, BatchDetails):
                value = value.to_json()
            out[f.name] = value.value if isinstance(value, Status) else value
        out.update({f"initial_val_{k}": v for k, v in self.initial_val.items()})
        out.update({f"final_val_{k}": v for k, v in self.final_val.items()})
        out.update(self.task_fields)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Summary:
        """A summary.json read back (a finished run asked to resume)."""
        names = {f.name for f in dataclasses.fields(cls)}
        known = {k: v for k, v in data.items() if k in names}
        known["batch_details"] = BatchDetails.from_json(known.get("batch_details") or {})
        summary = cls(**known)
        summary.initial_val = _prefixed(data, "initial_val_")
        summary.final_val = _prefixed(data, "final_val_")
        taken = names | {f"initial_val_{k}" for k in summary.initial_val}
        taken |= {f"final_val_{k}" for k in summary.final_val}
        summary.task_fields = {k: v for k, v in data.items() if k not in taken}
        return summary

    @classmethod
    def read(cls, run_dir: str | Path) -> Summary:
        """The summary.json a run left in `run_dir`."""
        return cls.from_json(json.loads(Path(run_dir, "summary.json").read_text()))

    def value(self, key: str) -> Json:
        """A summary.json key's value (KeyError when a run of this kind does not write it)."""
        return self.to_json()[key]

    def objective(self, metric: str | list[str]) -> float | list[float]:
        """The value(s) main() returns: one summary key, or several for multi-objective studies."""
        names = [metric] if isinstance(metric, str) else list(metric)
        values = []
        flat = self.to_json()
        for name in names:
            if name not in flat:
                raise KeyError(f"objective metric {name!r} is not in summary.json")
            value = flat[name]
            if isinstance(value, (list, dict)):
                raise TypeError(f"objective metric {name!r} is not a number: {value!r}")
            values.append(math.nan if value is None else float(value))
        return values[0] if isinstance(metric, str) else values


def _prefixed(data: Mapping[str, V], prefix: str) -> dict[str, V]:
    return {k.removeprefix(prefix): v for k, v in data.items() if k.startswith(prefix)}
