"""Did a grown dataset help? Two `mdot evaluate` runs scored on the samples both tested.

Adding families to a dataset changes its folds and adds test samples of its own, so the two
runs' tables are not comparable as they stand. Every sample of the smaller dataset is still
predicted by a model that never saw its family, in both runs: this pools each run's held-out
predictions over its folds and scores, per method and seed, the samples both runs tested
(`common`) and, for the newer run, the samples only it tested (`new only`).

    python benchmarks/compare_common.py \
        --before benchmarks/results/cpu-data-v1/cpu-amd-epyc-2t-fused-family \
        --after benchmarks/results/cpu-amd-epyc-2t-fused-family \
        --dataset data/derived/cpu-amd-epyc-2t-fused --methods lightgbm,gnn,gnn+lightgbm

A method `a+b` is the geometric mean of a and b with the same seed (as `mdot evaluate
--ensembles`). Labels come from `--dataset`, the grown dataset, which holds every sample of
both runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from mdot_jax.data import load_dataset
from mdot_jax.evaluate import read_results
from mdot_jax.metrics import regression_metrics


def pooled(rows: list[dict], method: str) -> dict[int, dict[str, float]]:
    """seed -> {sample key: predicted ms} over all folds; `a+b` is the geometric mean of the
    members' predictions with the same seed (seeds where every member ran)."""
    names = method.split("+")
    out: dict[int, dict[str, float]] = {}
    for seed in sorted({r["seed"] for r in rows if r["method"] == names[0]}):
        members = []
        for name in names:
            preds: dict[str, float] = {}
            for r in rows:
                if r["method"] == name and r["seed"] == seed:
                    preds.update(zip(r["test_keys"], r["pred_ms"]))
            members.append(preds)
        if all(members):
            keys = set.intersection(*(set(m) for m in members))
            out[seed] = {k: float(np.exp(np.mean([np.log(m[k]) for m in members])))
                         for k in keys}
    return out


def compare(before: list[dict], after: list[dict], labels: dict[str, float],
            methods: list[str]) -> list[dict]:
    """Per method and seed run in both: metrics on the common samples before and after, and
    on the samples only the newer run tested."""
    table = []
    for method in methods:
        b, a = pooled(before, method), pooled(after, method)
        for seed in sorted(set(b) & set(a)):
            common = sorted(set(b[seed]) & set(a[seed]))
            new = sorted(set(a[seed]) - set(b[seed]))
            if not common:
                continue
            row = dict(method=method, seed=seed, n_common=len(common), n_new=len(new),
                       before=regression_metrics([b[seed][k] for k in common],
                                                 [labels[k] for k in common]),
                       after=regression_metrics([a[seed][k] for k in common],
                                                [labels[k] for k in common]))
            if new:
                row["new_only"] = regression_metrics([a[seed][k] for k in new],
                                                     [labels[k] for k in new])
            table.append(row)
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="results dir of the smaller dataset")
    ap.add_argument("--after", required=True, help="results dir of the grown dataset")
    ap.add_argument("--dataset", required=True, help="the grown dataset (labels of both)")
    ap.add_argument("--methods", default="lightgbm,gnn,gnn+lightgbm")
    args = ap.parse_args()
    labels = {s.key: s.label_ms for s in load_dataset(args.dataset).samples}
    table = compare(read_results(args.before), read_results(args.after), labels,
                    args.methods.split(","))
    print("| method | seed | common samples | MAPE before % | MAPE after % | MAE before ms | "
          "MAE after ms | new-only samples | new-only MAPE % |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in table:
        new = f"{r['new_only']['mape']:.2f}" if "new_only" in r else ""
        print(f"| {r['method']} | {r['seed']} | {r['n_common']} | {r['before']['mape']:.2f} | "
              f"{r['after']['mape']:.2f} | {r['before']['mae_ms']:.1f} | "
              f"{r['after']['mae_ms']:.1f} | {r['n_new']} | {new} |")


if __name__ == "__main__":
    main()
