"""Variants of the LightGBM companion on the leave-family-out folds of `mdot evaluate` (the
same folds, validation carve-out and 3-booster bags as the shipped one): MAPE per fold and
layout. The README's "Tried on the companion and not kept" comes from these runs.

    python benchmarks/bench_companion.py --dataset data/derived/timm-rtx3090-fused \\
        --variants l1,residual --seeds 0,1

Variants: `l1` (shipped: absolute error of log time), `family-val` (`l1`, early stopping
and the grid point chosen on held-back whole families instead of random samples),
`family-weight` (`l1`, each training sample weighted by 1/sqrt of its family's size, so that
large families do not dominate), `huber`, `huber-monotone` (time rising with log batch, log
input size and the graph totals; LightGBM has no monotone L1), `residual` (trees fitted to
what a ridge line of log time on log FLOPs, bytes, operator count and the one-hots leaves),
`residual-conv` (the line also on each kind of convolution's FLOPs and log batch),
`per-flop` (log time per FLOP as the target), `intensity` (`l1` with, per band of arithmetic
intensity, < 1, 1-10, 10-100, >= 100 FLOPs per byte: the log FLOPs, bytes and count of the
operators in it; where a roofline splits memory- from compute-bound work).
"""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np
from tqdm import tqdm

from mdot_jax.companion import aggregates, fit_boosters
from mdot_jax.data.dataset import load_dataset, make_splits, split_groups, split_validation
from mdot_jax.data.features import LAYOUTS, PRECISIONS, graph_totals

VARIANTS = ("l1", "family-val", "family-weight", "huber", "huber-monotone", "residual",
            "residual-conv", "per-flop", "intensity")
BANDS = (0, 1, 10, 100, np.inf)  # arithmetic intensity, FLOPs per byte (`intensity` variant)
MONOTONE = 10  # leading aggregates: log2 batch, log2 input size, the 8 graph totals


def line_features(samples, devices, conv: bool) -> np.ndarray:
    """`[N, L]` the ridge line's inputs."""
    rows = []
    for s in samples:
        g, w = graph_totals(s.seq), s.workload
        t = np.log1p(g)
        row = [1.0, np.log1p(g[0] + g[1]), t[2], t[4]]
        row += [float(w.layout == x) for x in LAYOUTS]
        row += [float(w.precision == p) for p in PRECISIONS]
        row += [float(w.device == d) for d in devices]
        if conv:
            row += [*t[5:8], np.log2(w.batch_size)]
        rows.append(row)
    return np.array(rows)


def offsets(variant: str, tr, parts, devices) -> list[np.ndarray]:
    """Per part of `parts`, the log-time offset the trees' target is taken relative to."""
    if variant.startswith("residual"):
        conv = variant == "residual-conv"
        a, y = line_features(tr, devices, conv), np.log([s.label_ms for s in tr])
        coef = np.linalg.solve(a.T @ a + 1e-3 * np.eye(a.shape[1]), a.T @ y)
        return [line_features(p, devices, conv) @ coef for p in parts]
    if variant == "per-flop":
        return [np.array([np.log1p(graph_totals(s.seq)[:2].sum()) for s in p]) for p in parts]
    return [np.zeros(len(p)) for p in parts]


def intensity_bands(seq) -> np.ndarray:
    """`[12]` log FLOPs (forward + backward), log bytes and log count of the operators in
    each band of `BANDS`."""
    load = seq.load.astype(np.float64)
    flops, moved, intensity = load[:, 0] + load[:, 1], load[:, 2] + load[:, 3], load[:, 5]
    return np.log1p([[flops[m].sum(), moved[m].sum(), m.sum()]
                     for m in ((intensity >= lo) & (intensity < hi)
                               for lo, hi in zip(BANDS[:-1], BANDS[1:]))]).ravel()


def fit_predict(variant: str, train, test, seed: int) -> np.ndarray:
    """Predicted ms for `test`."""
    tr, val = split_validation(train, 0.1, seed, "family" if variant == "family-val" else "sample")
    devices = tuple(sorted({s.workload.device for s in train}))
    x, xv, xt = (np.stack([aggregates(s, devices) for s in p]) for p in (tr, val, test))
    if variant == "intensity":
        x, xv, xt = (np.hstack([a, [intensity_bands(s.seq) for s in p]])
                     for a, p in ((x, tr), (xv, val), (xt, test)))
    b, bv, bt = offsets(variant, tr, (tr, val, test), devices)
    y, yv = (np.log([s.label_ms for s in p]) for p in (tr, val))
    params = {}
    if variant.startswith("huber"):
        params = dict(objective="huber", alpha=0.15)
    if variant == "huber-monotone":
        params["monotone_constraints"] = [1] * MONOTONE + [0] * (x.shape[1] - MONOTONE)
    if variant == "family-weight":
        groups = split_groups(tr)
        size = Counter(groups)
        params["weight"] = np.array([size[g] ** -0.5 for g in groups])
    boosters = fit_boosters(x, y - b, xv, yv - bv, seed=seed, **params)
    return np.exp(np.mean([m.predict(xt) for m in boosters], axis=0) + bt)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--variants", default="l1,residual")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--folds", type=int, default=5)
    args = ap.parse_args()
    variants = args.variants.split(",")
    if unknown := sorted(set(variants) - set(VARIANTS)):
        ap.error(f"unknown variant(s) {', '.join(unknown)}: choose from {', '.join(VARIANTS)}")
    ds = load_dataset(args.dataset)
    splits = make_splits(ds, "family", args.folds, seed=0)  # the folds of `mdot evaluate`
    runs = [(v, int(s), i) for v in variants for s in args.seeds.split(",")
            for i in range(len(splits))]
    rows = []
    for variant, seed, fold in tqdm(runs, desc="companion variants"):
        train, test = ([ds.samples[j] for j in idx] for idx in splits[fold])
        ape = 100 * np.abs(fit_predict(variant, train, test, seed)
                           / np.array([s.label_ms for s in test]) - 1)
        layout = np.array([s.workload.layout for s in test])
        by_layout = "  ".join(f"{x} {ape[layout == x].mean():.2f}" for x in LAYOUTS
                              if (layout == x).any())
        rows.append((variant, seed, fold, ape.mean(), by_layout))
        tqdm.write(f"{variant} seed {seed} fold {fold}: MAPE {ape.mean():.2f}  ({by_layout})")
    print("\n| variant | seed | MAPE % per fold | mean |\n|---|---|---|---|")
    for variant in variants:
        for seed in args.seeds.split(","):
            m = [r[3] for r in rows if r[0] == variant and r[1] == int(seed)]
            print(f"| {variant} | {seed} | {' / '.join(f'{v:.2f}' for v in m)} "
                  f"| {np.mean(m):.2f} |")


if __name__ == "__main__":
    main()
