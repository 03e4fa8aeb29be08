"""The MDOT model (`mdot_jax.models`): jit, padding, shared rows, block attention, finite
predictions; on the `trained` tiny checkpoint (conftest.py)."""


import jax
import numpy as np
import pytest
from flax import nnx

from mdot_jax.data.features import FeatureCache

pytestmark = pytest.mark.slow  # every test here needs the trained network or compiles one


def _first_batch(trained, samples):
    cache = FeatureCache(trained.stats, trained.feature_cfg)
    return next(cache.batches(samples, 2048))[0]


def test_jit_equals_eager(trained, tiny_real_dataset):
    model = trained.model()
    batch = _first_batch(trained, tiny_real_dataset.samples)
    eager = model(batch)[0]
    graphdef, params = nnx.split(model)
    jitted = jax.jit(lambda p, b: nnx.merge(graphdef, p)(b)[0])(params, batch)
    np.testing.assert_allclose(np.asarray(eager), np.asarray(jitted), rtol=1e-5, atol=1e-5)


def test_padding_does_not_change_predictions(trained, tiny_real_dataset):
    """A sample predicts the same alone (batch padded with empty rows) or with others."""
    cache = FeatureCache(trained.stats, trained.feature_cfg)
    model = trained.model()
    batch, idx = next(cache.batches(tiny_real_dataset.samples, 2048))
    assert (idx[:, 0] >= 0).sum() >= 2
    together = np.asarray(model(batch)[0])  # [B, K]
    alone_batch, _ = next(cache.batches([tiny_real_dataset.samples[idx[1, 0]]], 2048))
    assert alone_batch.op_type.shape == batch.op_type.shape and alone_batch.weight.sum() == 1
    alone = np.asarray(model(alone_batch)[0])
    np.testing.assert_allclose(alone[0, 0], together[1, 0], rtol=1e-5, atol=1e-6)


def test_samples_sharing_a_sequence_share_a_row(trained, tiny_real_dataset):
    """Two workloads of one sequence are read out from one encoding, with the predictions
    of two separate rows."""
    import copy
    import dataclasses

    from mdot_jax.data.dataset import Sample

    s = tiny_real_dataset.samples[0]
    other = dataclasses.replace(s.workload, layout="nhwc")
    shared = [Sample.in_memory(s.seq, s.workload), Sample.in_memory(s.seq, other)]
    separate = [shared[0], Sample.in_memory(copy.copy(s.seq), other)]
    cache = FeatureCache(trained.stats, trained.feature_cfg)
    (batch, idx), = cache.batches(shared, 2048)
    assert idx[0].tolist() == [0, 1] and batch.weight.sum() == 2
    (batch2, idx2), = cache.batches(separate, 2048)
    assert idx2[:2, 0].tolist() == [0, 1] and idx2[0, 1] == -1
    model = trained.model()
    a, b = np.asarray(model(batch)[0]), np.asarray(model(batch2)[0])
    np.testing.assert_allclose(a[0, :2], b[:2, 0], rtol=1e-5, atol=1e-6)
    assert a[0, 0] != a[0, 1]  # the layout matters


def test_block_attention():
    """Block-local attention ignores padded keys and equals full attention when one block
    holds the whole sequence."""
    from mdot_jax.models.layers import Attention

    attn = Attention(16, 4, block=8, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (2, 32, 16))  # [B, T, D], 4 blocks of 8
    mask = np.arange(32)[None] < np.array([[20], [32]])
    y = attn(x, mask)
    np.testing.assert_allclose(attn(x.at[0, 20:].set(5.0), mask)[0, :20], y[0, :20], atol=1e-6)
    changed = attn(x.at[1, 0].set(5.0), mask)  # other blocks see block 0 via its summary
    assert np.abs(changed[1, 8:] - y[1, 8:]).max() > 1e-4
    full = Attention(16, 4, block=0, rngs=nnx.Rngs(0))
    attn.block = 32
    np.testing.assert_allclose(attn(x, mask), full(x, mask), atol=1e-6)


def test_diverged_predictions_stay_finite(trained, tiny_real_dataset):
    """A diverged model (log-time 1e4 standard deviations off) predicts a large finite time,
    never inf; sound predictions are untouched."""
    from mdot_jax.models.trained import MAX_Z, predict_samples

    cache = FeatureCache(trained.stats, trained.feature_cfg)
    samples = tiny_real_dataset.samples[:3]
    huge = predict_samples(lambda p, b: np.full(b.target.shape, 1e4), None, cache, samples)
    st = trained.stats
    assert np.allclose(huge, np.exp(MAX_Z * st.target_std + st.target_mean))
    zero = predict_samples(lambda p, b: np.zeros(b.target.shape), None, cache, samples)
    assert np.allclose(zero, np.exp(st.target_mean))
