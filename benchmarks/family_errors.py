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
from pathlib import Path

import numpy as np

from mdot_jax.data.dataset import load_dataset
from mdot_jax.evaluation.evaluate import ensemble_rows, read_results


def load_runs(results: str | Path, labels: dict[str, float], methods: list[str]) -> list[dict]:
    """A results folder's runs, plus a derived run per pair `a+b` among `methods`."""
    rows = read_results(results)
    return rows + ensemble_rows(rows, labels, [m for m in methods if "+" in m])


def family_means(runs: list[dict], labels: dict[str, float], family: dict[str, str],
                 families: list[str]) -> dict[str, float]:
    """family -> mean APE % over the runs' test samples of that family (nan: none)."""
    ape: dict[str, list[float]] = {f: [] for f in families}
    for r in runs:
        for k, p in zip(r["test_keys"], r["pred_ms"]):
            if family[k] in ape:
                ape[family[k]].append(100 * abs(p / labels[k] - 1))
    return {f: float(np.mean(v)) if v else float("nan") for f, v in ape.items()}


def run_name(method: str) -> str:
    """The `method` of a results row: a pair's rows are `ensemble(a+b)`."""
    return f"ensemble({method})" if "+" in method else method


def family_errors(dataset: str, results: str, methods: list[str], families: list[str]
                  ) -> dict[str, dict[str, float]]:
    """method -> family -> mean APE % (and `mean`: the families' mean)."""
    ds = load_dataset(dataset)
    labels = {s.key: s.label_ms for s in ds.samples}
    family = {s.key: s.family for s in ds.samples}
    rows = load_runs(results, labels, methods)
    out = {}
    for m in methods:
        means = family_means([r for r in rows if r["method"] == run_name(m)], labels, family,
                             families)
        if any(np.isnan(v) for v in means.values()):
            raise SystemExit(f"{m}: no runs of families "
                             f"{[f for f, v in means.items() if np.isnan(v)]}")
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
