"""Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"): the sign of an
interpolated momentum, so one moment of state instead of AdamW's two. Its update has the same
size on every weight, about lr: the paper uses a learning rate 3-10x smaller than AdamW's and a
weight decay 3-10x larger (conf/training/lion.yaml). The implementation is lion-pytorch's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.components.optim import OPTIMIZERS, NoArgs, Optimizer

if TYPE_CHECKING:
    import torch

    from app.components.optim import OptimizerSettings, ParamGroup


def build(groups: list[ParamGroup], t: OptimizerSettings, args: NoArgs) -> torch.optim.Optimizer:
    from lion_pytorch import Lion

    return Lion(groups, lr=t.lr, betas=tuple(t.betas), weight_decay=t.weight_decay)


OPTIMIZERS.add(
    Optimizer(
        "lion", label="Lion", build=build, state_bytes_per_param=4, args=NoArgs, uses_betas=True
    )
)
