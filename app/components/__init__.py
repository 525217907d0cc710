"""What a run is built from: hardware, models, tasks, data, optimizers, trackers. Each owns
its config and its facts, and each kind is found by name."""
