"""Resolve `precision=...` for the real device, with the reason; set the torch flags."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from app.components.hardware.config import GpuConfig
from app.components.hardware.devices import DeviceInfo
from app.core.errors import ConfigError

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class PrecisionPlan:
    name: str  # fp32 | tf32 | bf16 | fp16
    autocast_dtype: torch.dtype | None
    use_grad_scaler: bool
    tf32: bool  # TF32 tensor cores for the matmuls left in fp32
    reason: str


def resolve_precision(requested: str, device: DeviceInfo, preset: GpuConfig) -> PrecisionPlan:
    if device.type == "cpu":
        return _resolve_cpu(requested)
    cc = device.capability or 0.0
    ampere = cc >= 8.0
    if requested == "auto":
        requested = (
            preset.precision if preset.precision != "auto" else ("bf16" if ampere else "fp16")
        )
        if requested == "bf16" and not ampere:
            requested = "fp16"
        why = f"auto on {device.name} (compute capability {cc:.1f})"
    else:
        why = f"precision={requested} requested"
    if requested in ("bf16", "tf32") and not ampere:
        raise ConfigError(
            f"precision={requested} needs compute capability >= 8.0 but {device.name} has "
            f"{cc:.1f}; use precision=fp16, precision=fp32 or precision=auto"
        )
    if requested == "fp32":
        return PrecisionPlan("fp32", None, False, False, f"{why}: full fp32, TF32 off")
    if requested == "tf32":
        return PrecisionPlan("tf32", None, False, True, f"{why}: fp32 with TF32 matmuls")
    scaler = requested == "fp16"
    detail = (
        "fp16 autocast + GradScaler (fp16 overflows without loss scaling)"
        if scaler
        else ("bf16 autocast, no scaler needed (fp32 exponent range)")
    )
    return PrecisionPlan(requested, _DTYPES[requested], scaler, ampere, f"{why}: {detail}")


def _resolve_cpu(requested: str) -> PrecisionPlan:
    if requested in ("auto", "fp32"):
        why = "CPU: fp32 by default" if requested == "auto" else "precision=fp32 requested"
        return PrecisionPlan("fp32", None, False, False, why)
    if requested == "bf16":
        return PrecisionPlan(
            "bf16", torch.bfloat16, False, False, "precision=bf16 requested: CPU bf16 autocast"
        )
    raise ConfigError(
        f"precision={requested} needs a CUDA device; on CPU use precision=fp32, bf16 or auto"
    )


def apply_precision_flags(plan: PrecisionPlan) -> None:
    """TF32 is a process-wide switch; set it explicitly so a previous run's choice never leaks."""
    torch.set_float32_matmul_precision("high" if plan.tf32 else "highest")
    torch.backends.cudnn.allow_tf32 = plan.tf32


def autocast(plan: PrecisionPlan, device: torch.device) -> contextlib.AbstractContextManager:
    """The autocast region of a forward pass (none for fp32 and TF32)."""
    if plan.autocast_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=plan.autocast_dtype)
