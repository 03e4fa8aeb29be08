"""Measurement on the machine at hand: device identity (`device`), whole training
iterations of zoo models (`zoo`), single operators (`ops`, built from `specs`), and the fixed
core set and probe every device measures first (`core_set`)."""
