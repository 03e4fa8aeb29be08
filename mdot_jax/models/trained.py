"""A trained predictor and how it predicts: what training writes and serving reads.

`Trained` is the network with its configs and feature statistics (`checkpoint.save` writes
it, `checkpoint.load` reads it); `predict_samples` turns its standardised log-time outputs
into milliseconds, bucket by bucket.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import jax
import numpy as np
from flax import nnx

from mdot_jax.data.dataset import Sample
from mdot_jax.data.features import FeatureCache, FeatureConfig, FeatureStats
from mdot_jax.models.config import ModelConfig

MAX_Z = 8.0  # predictions are clipped to this many standard deviations of the log-time


@dataclass
class Trained:
    """A trained predictor: everything `checkpoint.save` writes."""

    graphdef: nnx.GraphDef
    params: nnx.State  # the parameters
    model_cfg: ModelConfig
    feature_cfg: FeatureConfig
    stats: FeatureStats
    history: list = field(default_factory=list)
    info: dict = field(default_factory=dict)

    def model(self):
        return nnx.merge(self.graphdef, self.params)


def predict_samples(predict_step, params, cache: FeatureCache, samples: Sequence[Sample],
                    tokens: int = 4096, *, shrink: bool = False) -> np.ndarray:
    """Predicted milliseconds for `samples` (in their order)."""
    out = np.zeros(len(samples))
    for batch, idx in cache.batches(samples, tokens, multiple=jax.device_count(),
                                    shrink=shrink):
        pred = np.asarray(predict_step(params, batch), np.float64)  # [B, K]
        # a diverged model must not give inf: at most MAX_Z standard deviations of the
        # training log-times from their mean (a factor of e^(MAX_Z * std))
        z = np.clip(pred[idx >= 0], -MAX_Z, MAX_Z)
        out[idx[idx >= 0]] = np.exp(z * cache.stats.target_std + cache.stats.target_mean)
    return out
