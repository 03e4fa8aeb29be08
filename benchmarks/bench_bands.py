"""Are the error bands honest on families they were not fitted on? For each fold of a
leave-family-out evaluation, bands are fitted on the other folds' held-out predictions and
scored on this fold's, per memory layout: share of measured times inside the 80% band, and
the band's median width (upper / lower end); binned by the members' disagreement
(`companion.spread`, shipped) or one band per layout.

    python benchmarks/bench_bands.py \\
        --results benchmarks/results/timm-rtx3090-fused-family \\
        --dataset data/derived/timm-rtx3090-fused

`--labels DIR` scores the same bands against another measurement of some of the samples
(e.g. `data/<device>/core-set-passes/2`, the core set measured again on another day): what
a user who times a job once on that day sees.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from mdot_jax.data.dataset import load_dataset
from mdot_jax.evaluation.evaluate import read_results
from mdot_jax.models.ensemble import combine, spread
from mdot_jax.storage import calibration


def score(cal, rows: list[dict], samples: dict, methods, labels: dict[str, float] | None = None
          ) -> dict[str, tuple[float, float]]:
    """Per layout: (share inside the band, median band width as upper / lower end) of
    `rows`' predictions, against the samples' labels or, for the keys it holds, `labels`."""
    preds = calibration.held_out(rows, methods)
    out = {}
    for layout in cal.bands:
        keys = sorted(k for k in preds[methods[0]] if samples[k].workload.layout == layout
                      and (labels is None or k in labels))
        members = [np.array([preds[m][k] for k in keys]) for m in methods]
        y = np.array([labels[k] if labels else samples[k].label_ms for k in keys])
        lo, hi = np.transpose([cal.interval(p, layout, d)
                               for p, d in zip(combine(*members), spread(*members))])
        out[layout] = float(np.mean((lo <= y) & (y <= hi))), float(np.median(hi / lo))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", required=True)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--methods", default="gnn,lightgbm")  # the shipped pair
    ap.add_argument("--labels", help="a dataset folder measuring some samples again")
    args = ap.parse_args()
    methods = tuple(args.methods.split(","))
    samples = load_dataset(args.dataset).samples
    by_key = {s.key: s for s in samples}
    labels = ({s.key: s.label_ms for s in load_dataset(args.labels).samples} if args.labels
              else None)
    rows = [r for r in read_results(args.results) if r["method"] in methods]
    seed = min(r["seed"] for r in rows)
    rows = [r for r in rows if r["seed"] == seed]
    folds = sorted({r["fold"] for r in rows})
    print(f"{args.results}: {' x '.join(methods)}, seed {seed}, {len(folds)} folds; "
          f"target coverage {calibration.COVER:.0%}"
          + (f"; against {args.labels} ({len(labels)} samples)" if labels else ""))
    print(f"{'layout':>7} {'bands':>7} {'coverage per fold':>28} {'mean':>6} {'median width':>13}")
    for binned in (True, False):
        scores = []  # per fold: {layout: (coverage, width)}
        for f in folds:
            cal = calibration.from_results([r for r in rows if r["fold"] != f], samples,
                                           methods, binned=binned)
            scores.append(score(cal, [r for r in rows if r["fold"] == f], by_key, methods,
                                labels))
        for layout in scores[0]:
            cover = [s[layout][0] for s in scores]
            width = math.exp(np.mean([math.log(s[layout][1]) for s in scores]))
            print(f"{layout:>7} {'binned' if binned else 'one':>7} "
                  f"{' '.join(f'{c:.0%}' for c in cover):>28} {np.mean(cover):>6.1%} "
                  f"{'x' + format(width, '.2f'):>13}")


if __name__ == "__main__":
    main()
