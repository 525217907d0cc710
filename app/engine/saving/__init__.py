"""Checkpoints: the training state, written atomically, whole or sharded (FSDP)."""
