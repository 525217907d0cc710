"""Analyses of a whole study, from its trials: the batch-size study (batch_size.py)."""
