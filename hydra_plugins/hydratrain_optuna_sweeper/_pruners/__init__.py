"""Pruners of this sweeper's own: ASHA with pausing, lines of trials, pruning on one of
several objectives.

Hydra's plugin scan imports every module of the plugin whose name has no leading `_`:
these keep one, so a run that composes no sweep never imports Optuna."""
