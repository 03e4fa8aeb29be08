"""Serving: self-describing checkpoints (`checkpoint`), error bands (`calibration`) and the
`Predictor` (`predict`). Nothing here imports `mdot_jax.evaluation`."""
