"""The gradient noise scale B_simple = tr(Sigma) / |G|^2 (McCandlish et al. 2018, "An Empirical
Model of Large-Batch Training"), which predicts the critical batch size: below it a larger
batch cuts the steps to a loss nearly in proportion, above it it mostly spends more data.

It is estimated from two gradients every step already has, with no extra backward pass: the
first micro-batch's (b samples, this rank's own: under DDP the first micro-batch's backward
runs without the all-reduce) and the whole step's (B = the effective batch, the gradient the
optimizer steps with). With G_b and G_B their means, the paper's unbiased estimates (appendix A)
are

    |G|^2    ~ (B |G_B|^2 - b |G_b|^2) / (B - b)
    tr(Sigma) ~ (|G_b|^2 - |G_B|^2) / (1/b - 1/B)

Single-step estimates are very noisy (often negative), so numerator and denominator are each
smoothed with an exponential moving average and B_simple is the ratio of the smoothed values.
Both stay on the device: reading the ratio is the only host sync, done at log points.
"""

from __future__ import annotations

import torch

from app.core.errors import ConfigError

SMOOTHING = 0.95  # EMA factor: about 20 steps of memory


class NoiseScale:
    """Two gradient norms per step in, the smoothed B_simple (in samples) out."""

    def __init__(self, effective_batch: int, device: torch.device, beta: float = SMOOTHING):
        self.big = effective_batch
        self.beta = beta
        self.grad_sq = torch.zeros((), device=device, dtype=torch.float64)  # EMA of |G|^2
        self.trace = torch.zeros((), device=device, dtype=torch.float64)  # EMA of tr(Sigma)
        self.steps = 0
        self._small: tuple[torch.Tensor, int] | None = None

    def small(self, sq_norm: torch.Tensor, samples: int) -> None:
        """|G_b|^2 of this step's first micro-batch, the mean gradient of its `samples`.
        A step redone after an out-of-memory error records it again."""
        self._small = (sq_norm.detach().double(), samples)

    def step(self, whole_norm: torch.Tensor) -> None:
        """|G_B| of the whole step (the norm clipping measures): one estimate in the EMAs."""
        if self._small is None:
            return
        small_sq, b = self._small
        self._small = None
        big, big_sq = self.big, whole_norm.detach().double() ** 2
        if b >= big:
            return
        grad_sq = (big * big_sq - b * small_sq) / (big - b)
        trace = (small_sq - big_sq) / (1.0 / b - 1.0 / big)
        # A step whose gradients overflowed (fp16's loss scale, which skips it) leaves both
        # averages as they were; decided on the device, without a sync.
        finite = torch.isfinite(grad_sq) & torch.isfinite(trace)
        grad_sq = torch.where(finite, grad_sq, self.grad_sq)
        trace = torch.where(finite, trace, self.trace)
        self.grad_sq.mul_(self.beta).add_(grad_sq, alpha=1 - self.beta)
        self.trace.mul_(self.beta).add_(trace, alpha=1 - self.beta)
        self.steps += 1

    def state_dict(self) -> dict[str, float | int]:
        """The averages as a checkpoint keeps them (plain numbers, exact: float64), so that a
        resumed run goes on with the estimate it had (a host sync, as a checkpoint is)."""
        return {"grad_sq": float(self.grad_sq), "trace": float(self.trace), "steps": self.steps}

    def load_state_dict(self, state: dict[str, float | int]) -> None:
        self.grad_sq.fill_(float(state["grad_sq"]))
        self.trace.fill_(float(state["trace"]))
        self.steps = int(state["steps"])

    def value(self) -> float | None:
        """B_simple in samples (a host sync); None before the first estimate, or while either
        smoothed estimate is not positive (too few steps to tell)."""
        if self.steps == 0:
            return None
        grad_sq, trace = float(self.grad_sq), float(self.trace)
        if grad_sq <= 0.0 or trace <= 0.0:
            return None
        return trace / grad_sq


def sq_grad_norm(params: list[torch.nn.Parameter]) -> torch.Tensor:
    grads = [p.grad for p in params if p.grad is not None]
    return torch.nn.utils.get_total_norm(grads, norm_type=2.0) ** 2


def check_plan(accumulation: int, micro: int, effective: int) -> None:
    """Refused where it cannot be estimated: one micro-batch per step gives no second size."""
    if accumulation < 2:
        raise ConfigError(
            f"training.noise_scale=true needs at least 2 micro-batches per step on each rank, "
            f"but the plan is micro-batch {micro} x accumulation {accumulation} for effective "
            f"batch {effective}; set training.micro_batch_size to at most half of a rank's share"
        )
