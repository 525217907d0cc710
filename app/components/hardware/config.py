"""The `gpu` and `precision` groups: a card's preset and the precision asked for."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from app.core.fields import bounded, count, one_of

PRECISIONS = ("auto", "fp32", "tf32", "bf16", "fp16")


@dataclass
class GpuConfig:
    name: str = MISSING  # preset name as typed on the command line (gpu=NAME)
    device_type: str = one_of("cuda", ("auto", "cuda", "cpu"))
    match: list[str] = field(default_factory=list)  # substrings of the NVML/torch device name
    memory_gib: float | None = bounded(None, low=0, low_open=True, nullable=True)  # label memory
    compute_capability: float | None = bounded(None, low=0, nullable=True)
    bf16: bool = False
    tf32: bool = False
    # Dense (no sparsity) peak TFLOP/s by compute dtype; empty = unknown, MFU is not reported.
    peak_tflops: dict[str, float] = field(default_factory=dict)
    precision: str = one_of("auto", PRECISIONS)  # what precision=auto resolves to on this card
    dataloader_workers: int = count(4)
    # Fraction of device memory kept free by the batch probe.
    memory_headroom: float = bounded(0.10, low=0.0, high=0.9)
    # GiB of the card this run's process may take (CUDA's per-process memory fraction; the
    # batch probe measures against it). null: the whole card. A sweep whose trials share a
    # GPU (hpo.trials_per_gpu=auto) sets it per trial to what the trial reserved.
    memory_limit_gib: float | None = bounded(None, low=0, low_open=True, nullable=True)
    compile: bool = False  # per-card default for model.compile=null


@dataclass
class PrecisionConfig:
    name: str = one_of("auto", PRECISIONS)
