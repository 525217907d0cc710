"""`python -m app.bench --mf-peers`: this sweeper's default study against the multi-fidelity
optimizers users know (Optuna's TPE with its HyperbandPruner, SMAC3's multi-fidelity facade,
DEHB, Syne Tune's ASHA and BOHB, Ray Tune's ASHA with an Optuna searcher) on synthetic
multi-fidelity benchmarks, under one protocol (`protocol.py`): the same fidelities, the same
compute, the same seeds, regret at full fidelity."""
