"""Multi-fidelity Hartmann functions: the published Hartmann 3 and 6 (Dixon & Szegő 1978, "The
global optimization problem: an introduction"; constants as in Surjanovic & Bingham's Virtual
Library of Simulation Experiments), made multi-fidelity as mf-prior-bench 1.10.0 does
(`mfpbench/synthetic/hartmann/generators.py`, after Kandasamy et al. 2017, "Multi-fidelity
Bayesian Optimisation with Continuous Approximations"): at fidelity z in [1, 100] each weight
alpha_i loses `bias * (1 - s)` and a half-normal noise of scale `noise * (1 - s)` is added, with
s = log z / log 100; at z = 100 the function is Hartmann's own, noiseless.

mf-prior-bench itself requires numpy<2 (this project's data stack needs NumPy 2), so its
formulas are here, term for term, and `tests/test_bench_mf.py` checks them against the package
where it is installed. The presets' (bias, noise) are its: good (2.5, 2.0), moderate (3.0,
3.0), bad (3.5, 4.0), terrible (4.0, 5.0): the larger, the less a low fidelity says about the
full one.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

MAX_FIDELITY = 100
NOISE_SEED = 1337  # mf-prior-bench's default: a point at a fidelity always gets the same noise

ALPHA = np.array([1.0, 1.2, 3.0, 3.2])
A3 = np.array([[3.0, 10, 30], [0.1, 10, 35], [3.0, 10, 30], [0.1, 10, 35]])
P3 = np.array([[3689, 1170, 2673], [4699, 4387, 7470], [1091, 8732, 5547], [381, 5743, 8828]])
A6 = np.array(
    [
        [10, 3, 17, 3.5, 1.7, 8],
        [0.05, 10, 17, 0.1, 8, 14],
        [3, 3.5, 1.7, 10, 17, 8],
        [17, 8, 0.05, 10, 0.1, 14],
    ]
)
P6 = np.array(
    [
        [1312, 1696, 5569, 124, 8283, 5886],
        [2329, 4135, 8307, 3736, 1004, 9991],
        [2348, 1451, 3522, 2883, 3047, 6650],
        [4047, 8828, 8732, 5743, 1091, 381],
    ]
)
# The global minima (the same references), at full fidelity
OPTIMUM = {3: -3.86278, 6: -3.32237}
PRESETS = {"good": (2.5, 2.0), "moderate": (3.0, 3.0), "bad": (3.5, 4.0), "terrible": (4.0, 5.0)}


@dataclass(frozen=True)
class Benchmark:
    """One multi-fidelity function on [0, 1]^dims, minimized; fidelities 1..MAX_FIDELITY."""

    name: str
    dims: int
    bias: float
    noise: float

    @property
    def optimum(self) -> float:
        return OPTIMUM[self.dims]

    def value(self, x: tuple[float, ...], z: int) -> float:
        """The function at point `x` and fidelity `z`."""
        a, p = (A3, P3) if self.dims == 3 else (A6, P6)
        scaled = np.log(z) / np.log(MAX_FIDELITY)  # log z between log 1 and log 100
        point = np.array(x, dtype=float).reshape(1, -1)
        alpha = ALPHA - self.bias * (1 - scaled)
        inner = np.sum(a * (point[:, np.newaxis, :] - 0.0001 * p) ** 2, axis=-1)
        h = -np.sum(alpha * np.exp(-inner), axis=-1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the seed overflows, as in mf-prior-bench
            rng = np.random.default_rng(seed=abs(NOISE_SEED * z * hash(tuple(x))))
        noise = np.abs(rng.normal(size=h.size)) * self.noise * (1 - scaled)
        return float((h + noise)[0])

    def regret(self, x: tuple[float, ...]) -> float:
        """How far `x` is from the optimum, at full fidelity."""
        return self.value(x, MAX_FIDELITY) - self.optimum


def benchmark(name: str) -> Benchmark:
    """`mfh3_good`, `mfh6_terrible`, ... (mf-prior-bench's names)."""
    family, _, preset = name.partition("_")
    dims = {"mfh3": 3, "mfh6": 6}.get(family)
    if dims is None or preset not in PRESETS:
        kinds = ", ".join(f"mfh{d}_{p}" for d in (3, 6) for p in PRESETS)
        raise ValueError(f"benchmark {name!r} is not one of {kinds}")
    bias, noise = PRESETS[preset]
    return Benchmark(name, dims, bias, noise)


# Two dimensions, each with a fidelity that tells the full one well and one that tells it badly
SUITE = ("mfh3_good", "mfh3_terrible", "mfh6_good", "mfh6_terrible")
