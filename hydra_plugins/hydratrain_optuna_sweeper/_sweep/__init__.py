"""A sweep from its plan to its end: the checks before the study is touched, the loop of one
worker (ask, launch, tell), what a job's return means for its trial, the fleet in its place.

Hydra's plugin scan imports every module of the plugin whose name has no leading `_`:
these keep one, so a run that composes no sweep never imports Optuna."""
