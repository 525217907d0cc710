"""The micro-batch plan, its probe and cache, and injected faults."""
