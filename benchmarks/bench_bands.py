"""Are the error bands honest on families they were not fitted on? For each fold of a
leave-family-out evaluation, bands are fitted on the other folds' held-out predictions and
scored on this fold's: share of measured times inside the 80% band, and the band's median
width (upper / lower end); binned by the MDOT/LightGBM disagreement (shipped) or one band.

    python benchmarks/bench_bands.py --results benchmarks/results/timm-rtx3090-fused-family \\
        --dataset ~/.cache/mdot/datasets/timm-rtx3090-fused
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from mdot_jax import calibration
from mdot_jax.data import load_dataset
from mdot_jax.evaluate import read_results


def score(cal, rows: list[dict], measured: dict[str, float], methods) -> tuple[float, float]:
    """(share inside the band, median band width as upper / lower) on `rows`' predictions."""
    preds = {m: {} for m in methods}
    for r in rows:
        preds[r["method"]].update(zip(r["test_keys"], r["pred_ms"]))
    keys = sorted(preds[methods[0]])
    a, b = (np.array([preds[m][k] for k in keys]) for m in methods)
    y = np.array([measured[k] for k in keys])
    d = np.abs(np.log(a / b)) if len(cal.bands) > 1 else [None] * len(keys)
    lo, hi = np.transpose([cal.interval(p, x) for p, x in zip(np.sqrt(a * b), d)])
    return float(np.mean((lo <= y) & (y <= hi))), float(np.median(hi / lo))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", required=True)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--methods", default="mdot-pe-none,lightgbm")
    args = ap.parse_args()
    methods = tuple(args.methods.split(","))
    measured = {s.key: s.label_ms for s in load_dataset(args.dataset).samples}
    rows = [r for r in read_results(args.results) if r["method"] in methods]
    seed = min(r["seed"] for r in rows)
    rows = [r for r in rows if r["seed"] == seed]
    folds = sorted({r["fold"] for r in rows})
    print(f"{args.results}: {' x '.join(methods)}, seed {seed}, {len(folds)} folds; "
          f"target coverage {calibration.COVER:.0%}")
    print(f"{'bands':>10} {'coverage per fold':>32} {'mean':>6} {'median width':>13}")
    for binned in (True, False):
        cover, width = [], []
        for f in folds:
            cal = calibration.from_results([r for r in rows if r["fold"] != f], measured,
                                           methods, binned=binned)
            c, w = score(cal, [r for r in rows if r["fold"] == f], measured, methods)
            cover.append(c)
            width.append(math.log(w))
        print(f"{'binned' if binned else 'one':>10} {' '.join(f'{c:.0%}' for c in cover):>32} "
              f"{np.mean(cover):>6.1%} {'x' + format(math.exp(np.mean(width)), '.2f'):>13}")


if __name__ == "__main__":
    main()
