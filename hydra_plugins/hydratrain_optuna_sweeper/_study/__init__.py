"""The study and its settings: the sweep's settings read once, the search space, samplers,
storage, the shared study's budget and what a trial costs, the fleet's plan.

Hydra's plugin scan imports every module of the plugin whose name has no leading `_`:
these keep one, so a run that composes no sweep never imports Optuna."""
