"""The typed config: the root schema assembled from the components' configs, loaded once at the entry."""
