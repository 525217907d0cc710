"""How the ranks share the model (DDP, FSDP2) and the memory each rank holds."""
