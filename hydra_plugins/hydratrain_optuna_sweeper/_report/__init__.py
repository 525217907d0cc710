"""What a sweep leaves behind: optimization_results.yaml, the report's records, the
batch-size study's answer.

Hydra's plugin scan imports every module of the plugin whose name has no leading `_`:
these keep one, so a run that composes no sweep never imports Optuna."""
