"""A gradient-boosted-tree companion to the network (GNN or MDOT): LightGBM on model-level
aggregates.

On both datasets' leave-family-out folds the geometric mean of the network's and this
model's predictions was more accurate than either alone (README, Evaluation): they err on
different models. A checkpoint may carry one (`companion.txt.xz`); the Predictor then
predicts `exp((log t_net + log t_trees) / 2)` and reports both parts.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from converters.sequence import CONFIG_FIELDS, OperatorSequence
from converters.vocab import UNK_ID, VOCAB
from mdot_jax.data.dataset import OP_MS, Sample, split_validation
from mdot_jax.data.features import conv_kinds, workload_raw

# (num_leaves, learning_rate) tried; the one with the lowest validation error is kept
GRID = ((15, 0.03), (31, 0.03), (15, 0.1), (31, 0.1))
# Absolute error of log time (a median regression), so that a family unlike the others does
# not pull the fit towards itself and away from the new family to predict (measured against
# squared and Huber losses: docs/architecture.md, Companion).
OBJECTIVE = "regression_l1"


# 1: workload, graph totals, op counts, depth; 2: + the convolution breakdown by kernel class;
# 3: + the grouped-convolution breakdown (CHANGELOG.md; each version was kept by a rule set
# before its confirming runs: benchmarks/results/timm-rtx3090-fused-family-aggv3/README.md)
AGGREGATES_VERSION = 3
_KERNEL_H, _STRIDE_H, _GROUPS, _C_IN, _C_OUT = (CONFIG_FIELDS.index(f) for f in (
    "kernel_h", "stride_h", "groups", "in_channels", "out_channels"))


def conv_breakdown(seq: OperatorSequence) -> np.ndarray:
    """`[15]`: log FLOPs (forward + backward), log bytes and log count of the convolutions in
    five overlapping classes with their own kernels: 1x1, 3x3, larger, strided, depthwise."""
    load, kinds = seq.load.astype(np.float64), conv_kinds(seq)
    is_conv, kh = kinds.sum(axis=1) > 0, seq.config[:, _KERNEL_H]
    classes = (kh == 1, kh == 3, kh > 3, seq.config[:, _STRIDE_H] > 1, kinds[:, 1] > 0)
    return np.log1p([[load[m, 0:2].sum(), load[m, 2:4].sum(), m.sum()]
                     for m in (is_conv & c for c in classes)]).ravel()


def group_breakdown(seq: OperatorSequence) -> np.ndarray:
    """`[14]`, where the RTX 3090's channels-last slowdowns are (RegNet, ResNeSt, NFNet run
    2-3x slower than in NCHW, ConvMixer and TResNet more): log FLOPs (forward + backward)
    and log count of the grouped convolutions by channels per group (< 8, 8-31, 32-127,
    >= 128); log FLOPs of the depthwise ones by width (< 256, >= 256 channels) x kernel (3x3
    or smaller, larger); log FLOPs and count of the other convolutions whose channels are
    not a multiple of 8."""
    kinds, cfg = conv_kinds(seq), seq.config
    flops = seq.load[:, 0:2].astype(np.float64).sum(axis=1)
    c_in, c_out = cfg[:, _C_IN], cfg[:, _C_OUT]
    per_group = c_in / np.maximum(cfg[:, _GROUPS], 1)
    depthwise, wide, big = kinds[:, 1] > 0, c_in >= 256, cfg[:, _KERNEL_H] > 3
    grouped = [(kinds[:, 2] > 0) & (per_group >= lo) & (per_group < hi)
               for lo, hi in ((0, 8), (8, 32), (32, 128), (128, np.inf))]
    unaligned = (kinds.sum(axis=1) > 0) & ~depthwise & ((c_in % 8 > 0) | (c_out % 8 > 0))
    out = [[flops[m].sum(), m.sum()] for m in grouped]
    out += [[flops[depthwise & (wide == w) & (big == k)].sum()]
            for w in (False, True) for k in (False, True)]
    out.append([flops[unaligned].sum(), unaligned.sum()])
    return np.log1p(np.concatenate(out))


_OP_GROUPS = {  # the predicted operator time of a graph, summed by kind of work
    "conv": ("Conv", "ConvTranspose"), "matmul": ("MatMul", "Gemm", "Einsum"),
    "norm": ("BatchNormalization", "LayerNormalization", "GroupNormalization",
             "InstanceNormalization"),
    "movement": ("Concat", "Split", "Slice", "Gather", "Pad", "Resize", "Transpose", "Reshape",
                 "Expand", "Tile"),
}


def op_time_breakdown(seq: OperatorSequence) -> np.ndarray:
    """`[len(_OP_GROUPS) + 1]`: log microseconds of predicted operator time by kind of work
    (the last: everything else, the elementwise operators)."""
    ms = np.asarray(seq.meta[OP_MS], np.float64)
    names = np.asarray(VOCAB)[seq.op_type]
    masks = [np.isin(names, ops) for ops in _OP_GROUPS.values()]
    rest = ~np.any(masks, axis=0)
    return np.log1p(1e3 * np.asarray([ms[m].sum() for m in [*masks, rest]]))


def aggregates(s: Sample, devices: Sequence[str], vocab_size: int = len(VOCAB),
               version: int = AGGREGATES_VERSION) -> np.ndarray:
    """`[F]` model-level features: workload and graph totals, log op counts by type, max depth
    (from version 2 the convolution breakdown, from 3 the grouped one), and where the
    sequence carries predicted operator times, their breakdown by kind of work. Op types newer than
    a model's `vocab_size` count as `<unk>` (F stays what it was fitted on)."""
    ids = np.where(s.seq.op_type < vocab_size, s.seq.op_type, UNK_ID)
    counts = np.bincount(ids, minlength=vocab_size)[:vocab_size]
    depth = s.seq.depths()[0].max() if s.seq.num_ops else 0
    parts = [workload_raw(s.workload, s.seq, devices), np.log1p(counts), [np.log1p(depth)]]
    if version >= 2:
        parts.append(conv_breakdown(s.seq))
    if version >= 3:
        parts.append(group_breakdown(s.seq))
    if OP_MS in s.seq.meta:  # op-grounded: predicted operator times (workload_raw: the total)
        parts.append(op_time_breakdown(s.seq))
    return np.concatenate(parts).astype(np.float32)


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
        return cls(text, tuple(devices), vocab_size, version, _parse(text))

    def predict(self, samples: Sequence[Sample]) -> np.ndarray:
        """`[N]` predicted ms per iteration."""
        if self._boosters is None:
            self._boosters = _parse(self.text)
        x = np.stack([aggregates(s, self.devices, self.vocab_size, self.version)
                      for s in samples])
        return np.exp(np.mean([b.predict(x) for b in self._boosters], axis=0))


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


def _parse(text: str) -> list:
    """The boosters of `text`; a truncated one is refused before LightGBM sees it (its parser
    aborts the process on some truncations, and prints to stdout)."""
    import lightgbm as lgb

    parts = text.split(_SEPARATOR)
    for i, part in enumerate(parts):
        if not part.startswith("tree\n") or "\nend of trees\n" not in part:
            raise ValueError(f"booster {i + 1} of {len(parts)} is truncated or not LightGBM text")
    return [lgb.Booster(model_str=part) for part in parts]


def _xy(samples: Sequence[Sample], devices: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    return (np.stack([aggregates(s, devices) for s in samples]),
            np.log([s.label_ms for s in samples]))


def combine(*members_ms: np.ndarray) -> np.ndarray:
    """`[N]`: the geometric mean of the members' predictions `[N]` each (all regress log
    time, so they are averaged in log space, equal weights)."""
    return np.exp(np.mean(np.log(np.asarray(members_ms, np.float64)), axis=0))


def spread(*members_ms: np.ndarray) -> np.ndarray:
    """`[N]`: how far the members' predictions `[N]` each are apart, max |log(t_i / t_j)|
    (for two members |log(t_a / t_b)|): where they disagree, the combination errs more."""
    logs = np.log(np.asarray(members_ms, np.float64))
    return logs.max(axis=0) - logs.min(axis=0)
