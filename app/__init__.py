"""hydratrain: a Hydra-configured PyTorch + transformers trainer whose entrypoint is also an
Optuna objective."""
