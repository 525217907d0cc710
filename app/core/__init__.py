"""The foundation every other package stands on: errors, outcomes, signals, atomic files. No torch."""
