"""AdamW with decoupled weight decay: the default optimizer."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.components.optim import OPTIMIZERS, NoArgs, Optimizer

if TYPE_CHECKING:
    import torch

    from app.components.optim import OptimizerSettings, ParamGroup


def build(groups: list[ParamGroup], t: OptimizerSettings, args: NoArgs) -> torch.optim.Optimizer:
    import torch

    # Fused AdamW runs on CUDA and, since torch 2.4, on CPU, where it is ~4x faster than the
    # per-parameter loop torch otherwise picks (docs/benchmarks.md, `python -m app.bench --adamw`).
    beta1, beta2 = t.betas
    return torch.optim.AdamW(
        groups, lr=t.lr, betas=(beta1, beta2), eps=t.eps, fused=fused(t) or None
    )


def fused(t: OptimizerSettings) -> bool:
    return True if t.fused_adamw is None else bool(t.fused_adamw)


OPTIMIZERS.add(
    Optimizer(
        "adamw",
        label="AdamW",
        build=build,
        state_bytes_per_param=8,  # two fp32 moments
        args=NoArgs,
        uses_betas=True,
        memory_identity=lambda t: [fused(t)],
    )
)
