"""How far a workload is from the data a predictor was trained on, and bands that widen with
that distance.

A sample is described by `features`: the share of each operator type in its graph (what it is
built of) and the logs of its FLOPs, bytes moved, operator count, parameters and batch size
(how big it is). `Novelty.fit(train)` keeps the training samples' features, scaled by their
spread; `distance(samples)` is each sample's Euclidean distance to its nearest training sample
in that space (0: a workload trained on); `far(families)` the distance beyond which a
workload is farther from the training data than a family left out of it usually is.

`DistanceBand` is an 80% band whose width grows with that distance: fitted on held-out
predictions (log errors and distances), it keeps per distance bin the 80% quantile of the
absolute log error, made non-decreasing with distance; beyond the farthest bin the width
grows in proportion to the distance.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from converters import VOCAB

FEATURES = len(VOCAB) + 5  # operator-type shares, then log FLOPs, bytes, ops, params, batch


def features(samples: Sequence) -> np.ndarray:
    """`[N, FEATURES]` of `data.Sample`s (their sequences and batch sizes)."""
    out = np.zeros((len(samples), FEATURES))
    for i, s in enumerate(samples):
        q = s.seq
        types = np.asarray(q.op_type)
        out[i, :len(VOCAB)] = np.bincount(types[types < len(VOCAB)], minlength=len(VOCAB)) \
            / max(len(types), 1)
        out[i, len(VOCAB):] = np.log1p([q.total("fwd_flops") + q.total("bwd_flops"),
                                        q.total("bytes"), q.num_ops, q.params,
                                        s.workload.batch_size])
    return out


@dataclass
class Novelty:
    """The training samples' features and the scale each feature is measured in."""

    train: np.ndarray  # [N, FEATURES], scaled
    scale: np.ndarray  # [FEATURES]

    @classmethod
    def fit(cls, train: Sequence) -> Novelty:
        x = features(train)
        # operator shares in units of their spread; a type no training graph has counts
        # as much as the rarest one that some graph has
        sd = x.std(0)
        scale = np.where(sd > 0, sd, sd[sd > 0].min() if (sd > 0).any() else 1.0)
        return cls(x / scale, scale)

    def distance(self, samples: Sequence) -> np.ndarray:
        """`[len(samples)]`: the distance to the nearest training sample."""
        return _nearest(features(samples) / self.scale, self.train)

    def far(self, families: Sequence[str], quantile: float = 0.95) -> float:
        """The distance beyond which a workload is far from the training data: the `quantile`
        of each training sample's distance to its nearest sample of another family (how far a
        family the predictor never saw usually is). `families`: the training samples'."""
        fam = np.asarray(families)
        nearest = _nearest(self.train, self.train, fam, fam)
        return float(np.quantile(nearest[np.isfinite(nearest)], quantile))


def _nearest(x: np.ndarray, train: np.ndarray, groups=None, train_groups=None,
             chunk: int = 256) -> np.ndarray:
    """`[len(x)]`: each row's distance to its nearest row of `train` (with `groups`: of
    another group; inf where there is none)."""
    out = np.empty(len(x))
    for i in range(0, len(x), chunk):
        d2 = ((x[i:i + chunk, None, :] - train[None]) ** 2).sum(-1)
        if groups is not None:
            d2[groups[i:i + chunk, None] == train_groups[None]] = np.inf
        out[i:i + chunk] = np.sqrt(d2.min(1))
    return out


@dataclass
class DistanceBand:
    """Half-widths (of log predictions) per distance bin: `edges[j]` is bin j's upper edge."""

    edges: list[float]
    widths: list[float]
    coverage: float = 0.8

    @classmethod
    def fit(cls, distance: np.ndarray, log_error: np.ndarray, coverage: float = 0.8,
            bins: int = 4) -> DistanceBand:
        distance, err = np.asarray(distance, float), np.abs(np.asarray(log_error, float))
        if len(err) < 2 * bins:
            bins = 1
        edges = np.quantile(distance, np.linspace(0, 1, bins + 1)[1:])
        which = np.minimum(np.searchsorted(edges, distance), bins - 1)
        widths = [float(np.quantile(err[which == j], coverage)) if (which == j).any() else 0.0
                  for j in range(bins)]
        return cls(edges.tolist(), np.maximum.accumulate(widths).tolist(), coverage)

    def width(self, distance: np.ndarray) -> np.ndarray:
        d = np.asarray(distance, float)
        edges, widths = np.asarray(self.edges), np.asarray(self.widths)
        w = widths[np.minimum(np.searchsorted(edges, d), len(edges) - 1)]
        far = d > edges[-1]  # beyond what was held out: in proportion to the distance
        return np.where(far, widths[-1] * d / max(edges[-1], 1e-9), w)

    def interval(self, pred: np.ndarray, distance: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        w = self.width(distance)
        return np.asarray(pred) * np.exp(-w), np.asarray(pred) * np.exp(w)
