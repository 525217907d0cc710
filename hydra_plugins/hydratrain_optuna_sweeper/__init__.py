"""Optuna sweeper for hydratrain: one Optuna trial per training run, with pruning.

Select it with `hpo=optuna` (conf/hpo/optuna.yaml). Settings live under `hpo.*`; the search space
under `hydra.sweeper.params` in the stock hydra-optuna-sweeper syntax. Modules whose name starts
with `_` hold the heavy imports: Hydra's plugin scan skips them.
"""
