"""Fleets: several workers on one study, on this node's processes or any Hydra launcher's
jobs, and how many trials share a GPU.

Hydra's plugin scan imports every module of the plugin whose name has no leading `_`:
these keep one, so a run that composes no sweep never imports Optuna."""
