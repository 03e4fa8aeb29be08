"""Feature normalisation statistics."""

import numpy as np

from mdot_jax.features import MIN_STD, fit_stats


def test_near_constant_features_are_not_divided_by_float_noise(tiny_real_dataset):
    stats = fit_stats(tiny_real_dataset.samples)
    for name in ("config_std", "load_std", "workload_std"):
        std = np.asarray(getattr(stats, name))
        assert np.all((std > MIN_STD) | (std == 1.0)), name
    assert np.isfinite(stats.target_std) and stats.target_std > 0
