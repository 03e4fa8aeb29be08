"""Mean APE of chosen families, per method, from a leave-family-out results folder: the
worst-families check of the shipping rules (docs/operators.md).

    python benchmarks/family_errors.py --dataset data/derived/cpu-amd-epyc-f25m17-2t-fused \
        --results benchmarks/results/cpu-amd-epyc-f25m17-2t-fused-ops-family-folds1 \
        --methods gnn+lightgbm,gnn-over-ops+lightgbm-over-ops --families mobileone,nf,poolformer

A method `a+b` is the geometric mean of a's and b's runs of the same fold and seed (as
`mdot evaluate --ensembles`). Each family's mean is over its samples and every seed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from mdot_jax.data.dataset import load_dataset
from mdot_jax.evaluation.evaluate import ensemble_rows


def family_errors(dataset: str, results: str, methods: list[str], families: list[str]
                  ) -> dict[str, dict[str, float]]:
    """method -> family -> mean APE % (and `mean`: the families' mean)."""
    ds = load_dataset(dataset)
    labels = {s.key: s.label_ms for s in ds.samples}
    family = {s.key: s.family for s in ds.samples}
    rows = [json.loads(line) for line in open(Path(results) / "results.jsonl")]
    combos = [m for m in methods if "+" in m]
    rows += ensemble_rows(rows, labels, combos)
    out = {}
    for m in methods:
        name = f"ensemble({m})" if "+" in m else m
        ape: dict[str, list[float]] = {f: [] for f in families}
        for r in rows:
            if r["method"] != name:
                continue
            for k, p in zip(r["test_keys"], r["pred_ms"]):
                if family[k] in ape:
                    ape[family[k]].append(100 * abs(p / labels[k] - 1))
        if any(not v for v in ape.values()):
            raise SystemExit(f"{m}: no runs of families {[f for f, v in ape.items() if not v]}")
        means = {f: float(np.mean(v)) for f, v in ape.items()}
        out[m] = {**means, "mean": float(np.mean(list(means.values())))}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", required=True)
    p.add_argument("--results", required=True)
    p.add_argument("--methods", required=True)
    p.add_argument("--families", default="mobileone,nf,poolformer")
    args = p.parse_args()
    families = args.families.split(",")
    table = family_errors(args.dataset, args.results, args.methods.split(","), families)
    print("| method | " + " | ".join(families) + " | mean |")
    print("|---" * (len(families) + 2) + "|")
    for m, v in table.items():
        print(f"| `{m}` | " + " | ".join(f"{v[f]:.1f}" for f in [*families, "mean"]) + " |")


if __name__ == "__main__":
    main()
