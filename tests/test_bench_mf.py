"""`python -m app.bench --mf-peers`: the protocol every contender is held to (what a study
spends, what it picks, its regret), the benchmark's formulas, and the profile end to end."""

from __future__ import annotations

import json
import random
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from app.bench.studies.mf.hartmann import MAX_FIDELITY, OPTIMUM, SUITE, benchmark
from app.bench.studies.mf.protocol import (
    FRACTIONS,
    BudgetSpent,
    Ledger,
    pick,
    regret_curve,
)
from app.bench.studies.mf.run import mf_table, run_mf_bench, suite_means, summaries

pytestmark = pytest.mark.unit

# Hartmann 3's and 6's minimizers (Surjanovic & Bingham): regret 0 at full fidelity
MINIMIZER = {
    3: (0.114614, 0.555649, 0.852547),
    6: (0.20169, 0.150011, 0.476874, 0.275332, 0.311652, 0.6573),
}


def test_continuing_a_trial_pays_its_furthest_fidelity_and_restarting_pays_every_evaluation():
    ledger = Ledger(benchmark("mfh3_good"), budget=1000)
    x = (0.5, 0.5, 0.5)
    for z in (5, 15, 45):  # one trial, continued: 45 in all
        ledger.evaluate(x, z, trial="a")
    assert ledger.spent == 45
    ledger.evaluate(x, 15, trial="a")  # going back costs nothing more
    assert ledger.spent == 45
    for z in (5, 15, 45):  # the same budgets, each restarted: 65 more
        ledger.evaluate(x, z)
    assert ledger.spent == 45 + 65
    assert [e.spent for e in ledger.evaluations] == [5, 15, 45, 45, 50, 65, 110]


def test_fidelities_are_rounded_into_the_protocols_range():
    ledger = Ledger(benchmark("mfh3_good"), budget=1000)
    ledger.evaluate((0.1, 0.2, 0.3), 3.7)  # SMAC's and DEHB's budgets are floats
    ledger.evaluate((0.1, 0.2, 0.3), 33.33)
    ledger.evaluate((0.1, 0.2, 0.3), 250)
    assert [e.fidelity for e in ledger.evaluations] == [5, 33, MAX_FIDELITY]


def test_a_spent_budget_refuses_more_and_the_evaluation_past_it_is_not_counted():
    ledger = Ledger(benchmark("mfh3_good"), budget=100)
    good = MINIMIZER[3]
    ledger.evaluate((0.9, 0.9, 0.9), 90)
    ledger.evaluate(good, 100)  # ends at 190, past the budget
    with pytest.raises(BudgetSpent):
        ledger.evaluate(good, 5)
    final = regret_curve(ledger)[-1]
    assert final == pytest.approx(benchmark("mfh3_good").regret((0.9, 0.9, 0.9)))
    assert final > 1.0  # not the optimum that came too late


def test_the_pick_is_the_best_value_at_the_highest_fidelity_evaluated():
    ledger = Ledger(benchmark("mfh3_terrible"), budget=10_000)
    low_but_cheap = (0.2, 0.5, 0.8)
    ledger.evaluate(MINIMIZER[3], 15)
    ledger.evaluate(low_but_cheap, 45)
    assert pick(ledger.evaluations, ledger.spent).x == low_but_cheap  # the highest fidelity
    ledger.evaluate(MINIMIZER[3], 100)
    assert pick(ledger.evaluations, ledger.spent).x == pytest.approx(MINIMIZER[3])
    assert pick(ledger.evaluations, 10) is None  # nothing had ended by then
    curve = regret_curve(ledger)
    assert len(curve) == len(FRACTIONS) and curve[-1] == pytest.approx(0.0, abs=1e-5)


@pytest.mark.parametrize("name", SUITE)
def test_at_full_fidelity_the_benchmark_is_hartmanns_function(name):
    bench = benchmark(name)
    assert bench.value(MINIMIZER[bench.dims], MAX_FIDELITY) == pytest.approx(
        OPTIMUM[bench.dims], abs=1e-5
    )
    rng = random.Random(0)
    x = tuple(rng.random() for _ in range(bench.dims))
    assert bench.value(x, 7) == bench.value(x, 7)  # a point's noise is its own, every time
    assert bench.value(x, 7) != bench.value(x, MAX_FIDELITY)


def test_the_formulas_are_mf_prior_benchs_where_it_is_installed():
    generators = pytest.importorskip("mfpbench.synthetic.hartmann.generators")
    rng = random.Random(1)
    for name in SUITE:
        bench = benchmark(name)
        cls = generators.MFHartmann3 if bench.dims == 3 else generators.MFHartmann6
        theirs = cls(
            n_fidelities=MAX_FIDELITY, fidelity_bias=bench.bias, fidelity_noise=bench.noise
        )
        for _ in range(50):
            x = tuple(rng.random() for _ in range(bench.dims))
            z = rng.randint(1, MAX_FIDELITY)
            assert bench.value(x, z) == theirs(z, x)


def test_an_unknown_benchmark_is_one_line_naming_the_known_ones():
    with pytest.raises(ValueError, match=r"is not one of mfh3_good, .*mfh6_terrible"):
        benchmark("branin")


def _fake(kind: str):
    """A contender that evaluates random points: continuing trials to the end, or restarting
    at budget 100 each time."""

    def run(ledger: Ledger, seed: int) -> None:
        rng = random.Random(seed)
        number = 0
        try:
            while ledger.left:
                x = tuple(rng.random() for _ in range(ledger.bench.dims))
                for z in range(5, 101, 5) if kind == "continuing" else (100,):
                    ledger.evaluate(x, z, trial=number if kind == "continuing" else None)
                number += 1
        except BudgetSpent:
            pass

    return run


def _broken(ledger: Ledger, seed: int) -> None:
    raise ImportError("No module named 'nothing'")


def test_every_contender_gets_the_same_compute_and_seeds_and_a_partial_run_is_kept(tmp_path):
    runs = {
        "continuing": (_fake("continuing"), "optuna"),
        "restarting": (_fake("restarting"), "optuna"),
        "absent": (_broken, "not-a-package"),
    }
    partial = tmp_path / "partial.jsonl"
    report = run_mf_bench(["mfh3_good"], list(runs), [0, 1], partial, runs)
    studies = report["studies"]
    assert len(studies) == 6 and report["budget"] == 2000
    ran = [s for s in studies if s["error"] is None]
    # the same random points either way: a whole trial costs 100 both ways
    assert all(s["spent"] == 2000 for s in ran)
    by = {(s["contender"], s["seed"]): s for s in ran}
    assert by[("continuing", 0)]["regret"] == by[("restarting", 0)]["regret"]
    assert by[("continuing", 0)]["regret"] != by[("continuing", 1)]["regret"]
    absent = [s for s in studies if s["contender"] == "absent"]
    assert all(s["error"].startswith("not installed") for s in absent)
    assert report["versions"]["not-a-package"] == "not installed"
    # a second run of the same command reads what the first wrote: nothing runs again
    assert len(partial.read_text().splitlines()) == 6
    rerun = {name: (_broken, package) for name, (_, package) in runs.items()}
    again = run_mf_bench(["mfh3_good"], list(runs), [0, 1], partial, rerun)
    assert again["studies"] == studies
    figures = summaries(report)["mfh3_good"]
    assert figures["continuing"]["seeds"] == 2 and set(figures) == {"continuing", "restarting"}
    assert suite_means(report)["continuing"] == pytest.approx(
        (by[("continuing", 0)]["regret"][-1] + by[("continuing", 1)]["regret"][-1]) / 2
    )
    table = mf_table(report)
    assert "not run: absent: not installed" in table and "not-a-package not installed" in table


def test_the_fractions_are_a_sixth_a_third_two_thirds_and_all():
    assert (Fraction(1, 6), Fraction(1, 3), Fraction(2, 3), Fraction(1)) == FRACTIONS


@pytest.mark.e2e
def test_the_profile_runs_the_default_study_and_a_peer_end_to_end(tmp_path):
    from tests import procs

    out = tmp_path / "mf.json"
    cmd = [
        sys.executable, "-m", "app.bench", "--mf-peers", "--benchmarks", "mfh3_good",
        "--seeds", "0", "--optimizers", "hydratrain-default,optuna-tpe-hyperband",
        "--json", str(out),
    ]  # fmt: skip
    proc = procs.run(cmd, cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    studies = {s["contender"]: s for s in report["studies"]}
    assert set(studies) == {"hydratrain-default", "optuna-tpe-hyperband"}
    for s in studies.values():
        assert s["error"] is None and s["spent"] >= 2000 - 100  # its budget, within a trial
        assert all(r is not None and r >= 0 for r in s["regret"])
    assert out.with_suffix(".png").is_file()
    assert "| mfh3_good |" in proc.stdout
