"""One protocol for every contender: the same fidelities, the same compute, the same seeds.

- Fidelities: 5 to 100 (the benchmark's full one). A contender that continues a trial reports
  every 5 (`EVERY`); one that evaluates a configuration at a budget asks for any budget in
  [5, 100] with its own halving rate, 3 for all (rounded to the benchmark's integer fidelity).
- Compute, in fidelity units as a training step is: a contender that continues a trial pays
  its furthest fidelity (a report at 45 after one at 15 costs 30), one that restarts a
  configuration at each budget pays every evaluation whole (`Ledger`). Each study may spend
  `budget_trials` full trials' worth (20: 2,000 units); an evaluation that ends past it is not
  counted.
- Result: the regret at full fidelity of the contender's pick (the best value at the highest
  fidelity it has evaluated) after 1/6, 1/3, 2/3 and all of the compute (`regret_curve`), and
  the study's wall time.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from fractions import Fraction

from app.bench.studies.mf.hartmann import MAX_FIDELITY, Benchmark

MIN_FIDELITY = 5
EVERY = 5  # a continuing contender reports at 5, 10, ..., 100
ETA = 3  # every contender's halving rate
BUDGET_TRIALS = 20  # full trials' worth of compute per study
FRACTIONS = (Fraction(1, 6), Fraction(1, 3), Fraction(2, 3), Fraction(1))


class BudgetSpent(Exception):
    """The study has spent its compute: the contender stops."""


@dataclass(frozen=True)
class Evaluation:
    """One evaluation, in the order they happened: the compute spent once it ended."""

    spent: int
    fidelity: int
    value: float
    x: tuple[float, ...]


@dataclass
class Ledger:
    """What a study evaluated and what that cost, under one budget of compute."""

    bench: Benchmark
    budget: int  # fidelity units
    evaluations: list[Evaluation] = field(default_factory=list)
    spent: int = 0
    _furthest: dict[Hashable, int] = field(default_factory=dict)

    @property
    def left(self) -> bool:
        return self.spent < self.budget

    def evaluate(self, x: tuple[float, ...], fidelity: float, trial: Hashable = None) -> float:
        """The benchmark at `x` and `fidelity` (rounded into [MIN_FIDELITY, MAX_FIDELITY]).
        `trial`: the run this evaluation continues (it pays only the fidelity beyond that
        run's furthest); None: a fresh evaluation, paid whole. Refused once the budget is
        spent (BudgetSpent)."""
        if not self.left:
            raise BudgetSpent(f"{self.spent} of {self.budget} spent")
        z = min(MAX_FIDELITY, max(MIN_FIDELITY, round(fidelity)))
        if trial is None:
            cost = z
        else:
            cost = max(0, z - self._furthest.get(trial, 0))
            self._furthest[trial] = max(z, self._furthest.get(trial, 0))
        self.spent += cost
        x = tuple(float(v) for v in x)
        value = self.bench.value(x, z)
        self.evaluations.append(Evaluation(self.spent, z, value, x))
        return value


def pick(evaluations: list[Evaluation], spent: float) -> Evaluation | None:
    """The contender's pick once `spent` units are spent: among the evaluations that ended by
    then, the best value at the highest fidelity evaluated (the full one, once reached)."""
    done = [e for e in evaluations if e.spent <= spent]
    if not done:
        return None
    top = max(e.fidelity for e in done)
    return min((e for e in done if e.fidelity == top), key=lambda e: e.value)


def regret_curve(ledger: Ledger) -> list[float | None]:
    """The pick's regret at full fidelity after each of FRACTIONS of the budget (None: nothing
    evaluated by then)."""
    out: list[float | None] = []
    for f in FRACTIONS:
        chosen = pick(ledger.evaluations, float(ledger.budget * f))
        out.append(None if chosen is None else ledger.bench.regret(chosen.x))
    return out
