"""Studies measured: pruning's savings, peers (the Trainer's study), budgets in data, the
default study, the sampler, fleets, the report."""
