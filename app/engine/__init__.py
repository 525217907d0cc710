"""The training engine: the run, the loop, the batch plan, checkpoints, telemetry. No Hydra,
no Optuna."""
