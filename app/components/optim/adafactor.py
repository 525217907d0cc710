"""Adafactor (Shazeer & Stern 2018), torch's own: the second moment of each matrix is kept as
its row and column means, so its state is a few bytes per row and column instead of AdamW's 8
bytes per parameter, and it has no first moment. `training.betas` and `training.eps` are not
read; its own settings are `training.optimizer_args` (the fields of `Args` below)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.components.optim import OPTIMIZERS, Optimizer
from app.core.fields import bounded

if TYPE_CHECKING:
    import torch

    from app.components.optim import OptimizerSettings, ParamGroup


@dataclass
class Args:
    # The second moment's decay at step t is 1 - t**beta2_decay (torch's default -0.8).
    beta2_decay: float = bounded(-0.8, high=0.0)
    eps1: float | None = bounded(None, low=0.0, low_open=True, nullable=True)  # null: dtype eps
    eps2: float = bounded(1e-3, low=0.0, low_open=True)  # relative step floor
    d: float = bounded(1.0, low=0.0, low_open=True)  # clipping threshold of the update's RMS


def build(groups: list[ParamGroup], t: OptimizerSettings, args: Args) -> torch.optim.Optimizer:
    import torch

    return torch.optim.Adafactor(
        groups,
        lr=t.lr,
        beta2_decay=args.beta2_decay,
        eps=(args.eps1, args.eps2),
        d=args.d,
        weight_decay=t.weight_decay,
    )


OPTIMIZERS.add(
    Optimizer(
        "adafactor",
        label="Adafactor",
        build=build,
        # Factored: 4 bytes per row and column of a matrix (0.04 bytes per parameter for a
        # 128 x 512 matrix), 4 per parameter of the vectors. 1 is an upper bound for widths
        # above ~10, with room for the vectors.
        state_bytes_per_param=1,
        args=Args,
        # torch's Adafactor updates its factored moments in place on the gradient's row and
        # column norms, which a sharded (DTensor) parameter cannot do in place (torch 2.13).
        steps_shards=False,
        # Its step is the weight's RMS x lr (a relative step): μP's init makes a hidden
        # matrix's RMS ∝ 1/sqrt(fan_in), so the rate needs only the rest of 1/width_mult.
        mup_exponent=0.5,
    )
)
