"""The learning-curve benchmark (`benchmarks/learning_curve.py`) subsamples whole families."""

from benches import bench

from mdot_jax.data.splits import split_groups

curve = bench("learning_curve")


def test_subsample_keeps_whole_families_and_all_at_fraction_one(tiny_real_dataset):
    samples = tiny_real_dataset.samples
    groups = split_groups(samples)
    assert curve.subsample(samples, 1.0, draw=0) == samples
    half = curve.subsample(samples, 0.5, draw=0)
    kept = set(split_groups(half))
    assert len(kept) == max(2, round(0.5 * len(set(groups))))
    assert len(half) == sum(g in kept for g in groups)  # every sample of a kept family
