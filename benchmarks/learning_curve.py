"""How does leave-family-out error fall with the number of training families?

A method of `mdot evaluate` (default the shipped LightGBM companion; seed 0, the main tables'
budget) on the folds of `mdot evaluate --split family`, each fold's training families (merged
as the split merges them) subsampled to a fraction, `--draws` draws per fraction below 1; the
test families stay the whole fold. Prints MAPE per method and fraction and power laws fitted
to it (MAPE = a * families^-b, over all fractions and over the upper ones, where the curve
flattens), and plots them. Rows go to `--out` as they finish (JSON lines); a re-run skips
them.

    python benchmarks/learning_curve.py --dataset data/derived/timm-rtx3090-fused \
        --out benchmarks/results/timm-rtx3090-fused-learning-curve [--methods gnn]

LightGBM takes 6 min per dataset; the GNN ~4 min per fit. Run it with nothing else on the
machine (LightGBM beside another job slows down many times over).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from tqdm import tqdm

from mdot_jax.data.dataset import load_dataset
from mdot_jax.data.splits import make_splits, split_groups
from mdot_jax.evaluation.methods import make_method
from mdot_jax.training.train import TrainConfig

FRACTIONS = (0.25, 0.5, 0.75, 1.0)
BUDGET = TrainConfig(epochs=20, patience=5)  # as in benchmarks/run_evaluations.sh


def subsample(train: list, fraction: float, draw: int) -> list:
    """The samples of a random `fraction` of `train`'s families (all of them at 1)."""
    if fraction >= 1:
        return train
    groups = np.array(split_groups(train))
    names = np.random.default_rng(draw).permutation(np.unique(groups))
    keep = set(names[:max(2, int(round(fraction * len(names))))])
    return [s for s, g in zip(train, groups) if g in keep]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--out", required=True, help="directory for rows.jsonl and the plot")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--methods", default="lightgbm")
    ap.add_argument("--fractions", default=",".join(map(str, FRACTIONS)))
    ap.add_argument("--draws", type=int, default=2, help="subsamples per fraction below 1")
    args = ap.parse_args()
    ds = load_dataset(args.dataset)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows_path = out / "rows.jsonl"
    done = [json.loads(line) for line in rows_path.open()] if rows_path.exists() else []
    for r in done:
        r.setdefault("method", "lightgbm")  # rows written before there was a choice
    seen = {(r["method"], r["fraction"], r["draw"], r["fold"]) for r in done}
    splits = make_splits(ds, "family", args.folds, seed=0)  # the folds of `mdot evaluate`
    runs = [(m, f, d, k) for m in args.methods.split(",")
            for f in map(float, args.fractions.split(","))
            for d in range(1 if f >= 1 else args.draws) for k in range(len(splits))
            if (m, f, d, k) not in seen]
    for method, fraction, draw, fold in tqdm(runs, desc="learning curve"):
        train, test = ([ds.samples[j] for j in idx] for idx in splits[fold])
        part = subsample(train, fraction, draw)
        model = make_method(method, 0, BUDGET)
        model.fit(part)
        ape = 100 * np.abs(model.predict(test) / np.array([s.label_ms for s in test]) - 1)
        row = dict(method=method, fraction=fraction, draw=draw, fold=fold,
                   mape=float(ape.mean()), families=len(set(split_groups(part))),
                   samples=len(part))
        with rows_path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        done.append(row)
    report(done, out, Path(args.dataset).name)


def report(rows: list[dict], out: Path, name: str) -> None:
    """Per method: table and power-law fits of MAPE against training families; one plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for method in sorted({r["method"] for r in rows}):
        fractions, fam, mape = curve(method, [r for r in rows if r["method"] == method], name)
        line, = ax.loglog(fam, mape, "o-", label=f"{method} (mean over folds)")
        upper = int(np.searchsorted(fractions, 0.5))
        for label, first in (("all fractions", 0), ("fractions >= 0.5", upper)):
            if len(fam) - first < 2 or (label != "all fractions" and not upper):
                continue
            b, log_a = np.polyfit(np.log(fam[first:]), np.log(mape[first:]), 1)
            print(f"power law over {label}: MAPE = {np.exp(log_a):.1f} * families^{b:.3f}",
                  end="")
            if b < 0:
                need = np.exp((np.log(7.0) - log_a) / b)
                print(f"; 7% at ~{need:.0f} training families (an extrapolation)", end="")
            print()
            grid = np.geomspace(fam[first], max(fam) * 4, 50)
            ax.loglog(grid, np.exp(log_a) * grid ** b, "--" if first else ":", lw=1,
                      color=line.get_color(), label=f"fit over {label}: slope {b:.2f}")
    ax.axhline(7.0, color="gray", lw=0.8, label="7% target")
    for axis, ticks in ((ax.xaxis, [10, 20, 50, 100, 200, 500]),
                        (ax.yaxis, [5, 7, 10, 15, 20, 30])):
        axis.set_ticks(ticks)
        axis.set_major_formatter(ScalarFormatter())
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("training families")
    ax.set_ylabel("held-out MAPE %")
    ax.set_title(f"{name}: leave-family-out error by training families", fontsize=9)
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out / "learning_curve.png", dpi=120)
    print(f"plot: {out / 'learning_curve.png'}")


def curve(method: str, rows: list[dict], name: str) -> tuple[list, list, list]:
    """Prints `method`'s table; returns its fractions, and per fraction the mean training
    families and MAPE."""
    print(f"\n{name}, {method}: leave-family-out MAPE by training families\n")
    print("| fraction | training families (mean) | runs | MAPE % (mean) | per fold |")
    print("|---|---|---|---|---|")
    fractions, fam, mape = sorted({r["fraction"] for r in rows}), [], []
    for fraction in fractions:
        sel = [r for r in rows if r["fraction"] == fraction]
        per_fold = [np.mean([r["mape"] for r in sel if r["fold"] == k])
                    for k in sorted({r["fold"] for r in sel})]
        fam.append(np.mean([r["families"] for r in sel]))
        mape.append(np.mean(per_fold))
        print(f"| {fraction:.2f} | {fam[-1]:.1f} | {len(sel)} | {mape[-1]:.2f} | "
              f"{' / '.join(f'{v:.2f}' for v in per_fold)} |")
    print()
    return fractions, fam, mape

if __name__ == "__main__":
    main()
