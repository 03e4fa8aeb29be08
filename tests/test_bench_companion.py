"""The companion-variant benchmark (`benchmarks/bench_companion.py`) measures what it says."""

import dataclasses
import importlib.util
from pathlib import Path

import numpy as np

SPEC = importlib.util.spec_from_file_location(
    "bench_companion", Path(__file__).parent.parent / "benchmarks" / "bench_companion.py")
bench = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench)


def test_its_l1_variant_is_the_shipped_companion(tiny_real_dataset):
    from mdot_jax.companion import TreeModel

    samples = tiny_real_dataset.samples
    train, test = samples[: len(samples) * 3 // 4], samples[len(samples) * 3 // 4:]
    shipped = TreeModel.fit(train, seed=0).predict(test)
    np.testing.assert_allclose(bench.fit_predict("l1", train, test, seed=0), shipped, rtol=1e-9)


def test_residual_offsets_follow_a_power_law_in_flops(tiny_real_dataset):
    """The ridge line fits log time; on labels that are exactly a power law of the FLOPs it
    leaves (almost) nothing to the trees."""
    from mdot_jax.data.features import graph_totals

    samples = tiny_real_dataset.samples
    flops = np.array([graph_totals(s.seq)[:2].sum() for s in samples])
    ms = 1e-9 * flops ** 0.8
    fake = [dataclasses.replace(s, label_ms=float(t)) for s, t in zip(samples, ms)]
    devices = tuple(sorted({s.workload.device for s in samples}))
    (b,) = bench.offsets("residual", fake, [fake], devices)
    np.testing.assert_allclose(b, np.log(ms), atol=0.05)
    (zero,) = bench.offsets("l1", fake, [fake], devices)
    assert not zero.any()


def test_intensity_bands_partition_the_operators(tiny_real_dataset):
    """Every operator is in exactly one band: the bands' counts, FLOPs and bytes add up to
    the graph's."""
    seq = tiny_real_dataset.samples[0].seq
    bands = np.expm1(bench.intensity_bands(seq)).reshape(-1, 3)  # [band, (FLOPs, bytes, n)]
    load = seq.load.astype(np.float64)
    np.testing.assert_allclose(bands.sum(axis=0), [load[:, :2].sum(), load[:, 2:4].sum(),
                                                   seq.num_ops], rtol=1e-5)
    assert (bands[:, 2] > 0).sum() >= 2  # a real model spans several bands
