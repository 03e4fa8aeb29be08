"""`mdot adapt` on a device no checkpoint was trained on: k measured samples of k families, the
error on every other family of that device, before and after.

    python benchmarks/bench_adapt.py --target data/cpu-amd-epyc-f25m17-2t \\
        --sequences data/derived/cpu-amd-epyc-f26m2-2t-fused --base cpu-amd-epyc-f26m2-2t

The target's labels are its own measurements; the operator sequences come from `--sequences`
(a fused copy holding the same keys: the same model, size and batch is the same graph on any
device), as the shipped checkpoints read fused sequences. Each draw picks k families at random
(seeded), adapts on one sample of each, and scores every sample of the other families.
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from mdot_jax.data.dataset import load_dataset
from mdot_jax.serving.adaptation import fit
from mdot_jax.serving.predict import Predictor


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True, help="the new device's dataset (labels)")
    p.add_argument("--sequences", required=True, help="a fused dataset with the same keys")
    p.add_argument("--base", required=True, help="checkpoint to adapt")
    p.add_argument("--k", type=int, nargs="+", default=[5, 10, 20])
    p.add_argument("--draws", type=int, default=5)
    args = p.parse_args()

    labels = {s.key: s for s in load_dataset(args.target).samples}
    samples = [s for s in load_dataset(args.sequences).samples if s.key in labels]
    predictor = Predictor.load(args.base)
    pred = np.array([p.iteration_ms for p in predictor.predict_many(  # as for its own device
        [(s.seq, dataclasses.replace(s.workload, device=predictor.devices[0]))
         for s in samples])])
    true = np.array([labels[s.key].label_ms for s in samples])
    family = np.array([s.family for s in samples])
    families = sorted(set(family))
    ape = lambda p, t: 100 * np.abs(p / t - 1)  # noqa: E731
    print(f"{len(samples)} samples of {len(families)} families on {args.target}, base "
          f"{args.base}: unadapted MAPE {ape(pred, true).mean():.1f}%")
    print("| k | fit chosen | adapted MAPE % | expected (leave-one-out) % | 80% band held % |")
    print("|---|---|---|---|---|")
    for k in args.k:
        rows = []
        for draw in range(args.draws):
            rng = np.random.default_rng(draw)
            chosen = rng.choice(families, k, replace=False)
            idx = [int(rng.choice(np.flatnonzero(family == f))) for f in chosen]
            test = ~np.isin(family, chosen)
            a = fit(pred[idx], true[idx], "target")
            adapted = a.apply(pred[test])
            lo, hi = adapted * np.exp(a.lo), adapted * np.exp(a.hi)
            held = np.mean((true[test] >= lo) & (true[test] <= hi)) * 100
            rows.append((a.fit, ape(adapted, true[test]).mean(), a.loo_mape, held))
        fits = ", ".join(sorted({r[0] for r in rows}))
        m = np.array([r[1:] for r in rows]).mean(axis=0)
        print(f"| {k} | {fits} | {m[0]:.1f} | {m[1]:.1f} | {m[2]:.0f} |")


if __name__ == "__main__":
    main()
