"""The foundation every other package stands on: errors, settings, registries, outcomes,
signals, atomic files. No torch."""
