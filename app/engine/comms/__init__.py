"""What the ranks say to each other: process groups (distributed.py), the OOM agreement,
the bound on a wait for a peer."""
