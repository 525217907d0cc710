"""Stands for an installed hydra-optuna-sweeper: a regular package (this `__init__.py`) of the
stock plugin's name, put on the path by tests/test_sweeper_stock_gaps.py."""
