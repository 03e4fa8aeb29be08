"""A gradient-boosted-tree model of iteration time: LightGBM on model-level aggregates
(`data.aggregates`), the network's partner in a checkpoint (`companion.txt.xz`).

On the leave-family-out folds the geometric mean of the network's and this model's
predictions (`models.ensemble.combine`) was more accurate than either alone: they err on
different models.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from converters.vocab import VOCAB
from mdot_jax.data.aggregates import AGGREGATES_VERSION, aggregates
from mdot_jax.data.dataset import Sample
from mdot_jax.data.splits import split_validation

# (num_leaves, learning_rate) tried; the one with the lowest validation error is kept
GRID = ((15, 0.03), (31, 0.03), (15, 0.1), (31, 0.1))
# Absolute error of log time (a median regression), so that a family unlike the others does
# not pull the fit towards itself and away from the new family to predict (measured against
# squared and Huber losses: docs/architecture.md, Companion).
OBJECTIVE = "regression_l1"

# Boosters fitted with seeds seed..seed+SEEDS-1, their log predictions averaged: LightGBM's
# row and feature bagging make one booster's held-out error depend on its seed.
SEEDS = 3
_SEPARATOR = "\n# mdot: next booster\n"  # between boosters in `text` (one: none)


@dataclass
class TreeModel:
    """LightGBM regressors of log iteration time, averaged; `text` holds the boosters in
    LightGBM's own format, separated by `_SEPARATOR`."""

    text: str
    devices: tuple[str, ...]
    vocab_size: int = len(VOCAB)  # the operator vocabulary it was fitted with
    version: int = AGGREGATES_VERSION  # of its features (`aggregates`)
    _boosters: list = field(default=None, repr=False, compare=False)

    @classmethod
    def fit(cls, train: Sequence[Sample], *, seed: int = 0, val_fraction: float = 0.1,
            val_by: str = "sample", grid: Sequence[tuple[int, float]] = GRID,
            seeds: int = SEEDS) -> TreeModel:
        """Per booster seed, early stopping and the grid point on the same validation
        carve-out as MDOT's (split with `seed`)."""
        tr, val = split_validation(train, val_fraction, seed, val_by)
        devices = tuple(sorted({s.workload.device for s in train}))
        boosters = fit_boosters(*_xy(tr, devices), *_xy(val, devices), seed=seed,
                                grid=grid, seeds=seeds)
        text = _SEPARATOR.join(b.model_to_string() for b in boosters)
        return cls(text, devices, _boosters=boosters)

    @property
    def objective(self) -> str:
        """LightGBM's name of the loss the boosters were fitted with."""
        found = re.search(r"^objective=(\S+)", self.text, re.M)
        return found.group(1) if found else "?"

    @classmethod
    def from_text(cls, text: str, devices: Sequence[str], vocab_size: int,
                  version: int) -> TreeModel:
        """Parses `text` now (LightGBM raises on a corrupt model)."""
        return cls(text, tuple(devices), vocab_size, version, parse_boosters(text))

    def predict(self, samples: Sequence[Sample]) -> np.ndarray:
        """`[N]` predicted ms per iteration."""
        if self._boosters is None:
            self._boosters = parse_boosters(self.text)
        x = np.stack([aggregates(s, self.devices, self.vocab_size, self.version)
                      for s in samples])
        with PREDICTING:
            return np.exp(np.mean([b.predict(x) for b in self._boosters], axis=0))


# LightGBM prepares a shared booster's predictor without a lock (upstream, LightGBM #6142): one
# prediction at a time per process, so that threads (the service's) get the same answers
PREDICTING = threading.Lock()


def fit_boosters(x: np.ndarray, y: np.ndarray, xv: np.ndarray, yv: np.ndarray, *,
                 seed: int = 0, grid: Sequence[tuple[int, float]] = GRID, seeds: int = SEEDS,
                 weight: np.ndarray | None = None, categorical: Sequence[int] = (),
                 **params) -> list:
    """`seeds` LightGBM boosters of `y` (log ms) on `x` `[N, F]`, seeds seed..seed+seeds-1,
    each the grid point with the lowest validation MAPE on (`xv`, `yv`) after early stopping
    there. `weight` `[N]`: per training row (None: equal); `categorical`: columns holding
    category ids. `params` override LightGBM's (e.g. `objective`)."""
    import lightgbm as lgb

    boosters = []
    for booster_seed in range(seed, seed + seeds):
        best = None
        for leaves, lr in grid:
            p = dict(objective=OBJECTIVE, learning_rate=lr, num_leaves=leaves,
                     min_data_in_leaf=5, bagging_fraction=0.8, bagging_freq=1,
                     feature_fraction=0.8, seed=booster_seed, verbose=-1, num_threads=2)
            train = lgb.Dataset(x, y, weight=weight,
                                categorical_feature=list(categorical) or "auto")
            booster = lgb.train(p | params, train, num_boost_round=2000,
                                valid_sets=[lgb.Dataset(xv, yv, reference=train)],
                                callbacks=[lgb.early_stopping(100, verbose=False)])
            err = np.mean(np.abs(np.expm1(booster.predict(xv) - yv)))
            if best is None or err < best[0]:
                best = (err, booster)
        boosters.append(best[1])
    return boosters


def parse_boosters(text: str) -> list:
    """The LightGBM boosters of `text` (one, or several joined by `_SEPARATOR`); a truncated
    one is refused before LightGBM sees it (its parser aborts the process on some
    truncations, and prints to stdout)."""
    import lightgbm as lgb

    parts = text.split(_SEPARATOR)
    for i, part in enumerate(parts):
        if not part.startswith("tree\n") or "\nend of trees\n" not in part:
            raise ValueError(f"booster {i + 1} of {len(parts)} is truncated or not LightGBM text")
    return [lgb.Booster(model_str=part) for part in parts]


def _xy(samples: Sequence[Sample], devices: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    return (np.stack([aggregates(s, devices) for s in samples]),
            np.log([s.label_ms for s in samples]))
