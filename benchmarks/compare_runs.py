"""Two results folders of the same samples, compared run for run: the A/B check of the
shipping rules (docs/operators.md), e.g. fusion version 1 against version 2.

    python benchmarks/compare_runs.py --dataset data/derived/timm-rtx3090-fused \
        --a benchmarks/results/timm-rtx3090-fused-family \
        --b benchmarks/results/timm-rtx3090-fused-v2-family --methods lightgbm,gnn,gnn+lightgbm

Only the (method, fold, seed) runs present in both folders count, so a half-finished B is
read against the same runs of A. A method `a+b` is the geometric mean of a's and b's runs of
the same fold and seed (as `mdot evaluate --ensembles`). `--families` adds each family's mean
APE over the matched runs (e.g. the families a change touches). `--on-a` scores B only on the
samples A tested: for a B whose dataset grew (its folds then differ from A's, so runs are not
paired: compare the means; `--dataset` is B's). `--without` scores both sides on the samples of
the other families only (still paired): what a change meant for some families did to the rest.
"""

from __future__ import annotations

import argparse

import numpy as np
from family_errors import family_means, load_runs, run_name  # this folder (run as a script)

from mdot_jax.data.dataset import load_dataset


def restricted(run: dict, keys: set[str], labels: dict[str, float]) -> dict:
    """`run` scored only on its test samples among `keys`."""
    kept = [(k, p) for k, p in zip(run["test_keys"], run["pred_ms"]) if k in keys]
    mape = 100 * float(np.mean([abs(p / labels[k] - 1) for k, p in kept]))
    return dict(run, test_keys=[k for k, _ in kept], pred_ms=[p for _, p in kept],
                metrics=dict(run["metrics"], mape=mape))


def compare(dataset: str, a: str, b: str, methods: list[str], families: list[str] = (),
            on_a: bool = False, without: list[str] = ()) -> list[dict]:
    """Per method: matched runs, mean MAPE of A and B, runs where B is better (None when
    `on_a` unpairs them), family means."""
    ds = load_dataset(dataset)
    labels = {s.key: s.label_ms for s in ds.samples}
    family = {s.key: s.family for s in ds.samples}
    runs_a, runs_b = ({(r["method"], r["fold"], r["seed"]): r
                       for r in load_runs(side, labels, methods)} for side in (a, b))
    if on_a:
        tested = {k for r in runs_a.values() for k in r["test_keys"]}
        runs_b = {k: restricted(r, tested, labels) for k, r in runs_b.items()}
    if without:
        rest = {k for k, f in family.items() if f not in without}
        runs_a, runs_b = ({k: restricted(r, rest, labels) for k, r in runs.items()}
                          for runs in (runs_a, runs_b))
    out = []
    for m in methods:
        keys = sorted(k for k in runs_a if k[0] == run_name(m) and k in runs_b)
        if not keys:
            out.append(dict(method=m, runs=0))
            continue
        if not on_a and any(runs_a[k]["test_keys"] != runs_b[k]["test_keys"] for k in keys):
            raise SystemExit(f"{m}: A and B tested different samples on the same fold")
        mape_a = [runs_a[k]["metrics"]["mape"] for k in keys]
        mape_b = [runs_b[k]["metrics"]["mape"] for k in keys]
        row = dict(method=m, runs=len(keys), a=float(np.mean(mape_a)), b=float(np.mean(mape_b)),
                   b_better=None if on_a else int(sum(y < x for x, y in zip(mape_a, mape_b))))
        for side, runs in (("a", runs_a), ("b", runs_b)):
            means = family_means([runs[k] for k in keys], labels, family, families)
            row.update({f"{f}_{side}": v for f, v in means.items()})
        out.append(row)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", required=True, help="labels and families (either side's)")
    p.add_argument("--a", required=True, help="results folder read as the reference")
    p.add_argument("--b", required=True, help="results folder compared with it")
    p.add_argument("--methods", required=True, help="comma-separated; a+b for a pair")
    p.add_argument("--families", default="", help="comma-separated family names")
    p.add_argument("--on-a", action="store_true",
                   help="score B only on the samples A tested (unpaired runs)")
    p.add_argument("--without", default="", help="comma-separated families: score both sides "
                                                 "on the other families' samples only")
    args = p.parse_args()
    families = [f for f in args.families.split(",") if f]
    print("| method | runs | A MAPE % | B MAPE % | B - A | B better |"
          + "".join(f" {f} A -> B |" for f in families))
    print("|---" * (6 + len(families)) + "|")
    for r in compare(args.dataset, args.a, args.b, args.methods.split(","), families, args.on_a,
                     [f for f in args.without.split(",") if f]):
        if not r["runs"]:
            print(f"| `{r['method']}` | 0 | | | | |" + " |" * len(families))
            continue
        print(f"| `{r['method']}` | {r['runs']} | {r['a']:.2f} | {r['b']:.2f} | "
              f"{r['b'] - r['a']:+.2f} | "
              + ("unpaired" if r["b_better"] is None else f"{r['b_better']} of {r['runs']}")
              + " |"
              + "".join(f" {r[f + '_a']:.1f} -> {r[f + '_b']:.1f} |" for f in families))


if __name__ == "__main__":
    main()
