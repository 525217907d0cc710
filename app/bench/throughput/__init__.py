"""Training speed: the trainer, a bare PyTorch loop and the transformers Trainer on one
machine (contenders, profiles, rounds or lockstep, medians and tables), DDP and FSDP."""
