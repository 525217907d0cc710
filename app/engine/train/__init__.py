"""The loop and what it runs: a step with its accumulation, OOM recovery, evaluation and
the throughput of each log window."""
