"""AdamW with decoupled weight decay on matrices only, and the warmup + decay schedule."""

from __future__ import annotations

import math

import torch
from omegaconf import DictConfig


def build_optimizer(model: torch.nn.Module, cfg: DictConfig) -> torch.optim.AdamW:
    # Biases and norm gains (1-D) are not decayed: shrinking them towards zero only hurts.
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    # Fused AdamW runs on CUDA and, since torch 2.4, on CPU, where it is ~4x faster than the
    # per-parameter loop torch otherwise picks (docs/benchmarks.md, `python -m app.bench --adamw`).
    fused = True if cfg.fused_adamw is None else bool(cfg.fused_adamw)
    return torch.optim.AdamW(
        groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, fused=fused or None
    )


def lr_multiplier(step: int, cfg: DictConfig) -> float:
    """Linear warmup to 1, then cosine/linear decay to min_lr_ratio at max_steps (or constant)."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    span = max(1, cfg.max_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    if cfg.schedule == "linear":
        shape = 1.0 - progress
    else:
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: DictConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_multiplier(step, cfg))
