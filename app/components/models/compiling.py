"""Whether a model runs compiled, and compiling it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from app.components.hardware.config import GpuConfig
    from app.components.models.config import ModelConfig


def compiles(m: ModelConfig, preset: GpuConfig) -> bool:
    """model.compile, or the card's default when it is null."""
    return bool(preset.compile if m.compile is None else m.compile)


def maybe_compile(model: torch.nn.Module, m: ModelConfig, preset: GpuConfig) -> torch.nn.Module:
    if not compiles(m, preset):
        return model
    import torch

    return torch.compile(model, mode=m.compile_mode)  # type: ignore[return-value]
