"""Would the timm inference tables help predict training time of unseen families?

A cheap probe before building an inference dataset (every architecture exported again at the
inference batch sizes, ~2 h of this machine): LightGBM on the tables' own columns (GMACs and
activations per batch, parameters, batch, image size, a train/inference flag, layout, GPU),
on the timm dataset's training samples whose architecture the inference table also lists at
the same image size, over the leave-family-out folds of `mdot evaluate`. With or without the
inference rows of the families not held out (3090 and 4090), MAPE per fold.

    python benchmarks/probe_inference_tables.py --dataset data/derived/timm-rtx3090-fused \\
        --tables ../shared/datasets/timm-rtx3090
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import lightgbm as lgb
import numpy as np

from mdot_jax.data.dataset import family_of, load_dataset, make_splits, split_groups

PARAMS = dict(objective="l1", learning_rate=0.05, num_leaves=15, min_data_in_leaf=5,
              verbose=-1, seed=0)
ROUNDS = 600


def features(row: dict, batch: int, img: int, train: bool, nhwc: bool, gpu: int) -> list:
    """`[8]` log GMACs and log activations per batch, log params, log batch, image size, flags."""
    gmacs, macts, params = (float(row[k]) for k in ("infer_gmacs", "infer_macts", "param_count"))
    return [np.log(gmacs * batch), np.log(macts * batch), np.log(params), np.log(batch), img,
            float(train), float(nhwc), float(gpu)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="data/derived/timm-rtx3090-fused")
    ap.add_argument("--tables", default="../shared/datasets/timm-rtx3090")
    args = ap.parse_args()
    tables = [{r["model"]: r for r in csv.DictReader(open(p))}
              for p in sorted(Path(args.tables).glob("benchmark-infer-*rtx*.csv"))]
    if not tables:
        raise SystemExit(f"{args.tables}: no benchmark-infer-*.csv tables")
    ds = load_dataset(args.dataset)
    group = dict(zip((s.family for s in ds.samples), split_groups(ds.samples)))

    train = []  # (sample index, features, log ms, group)
    for i, s in enumerate(ds.samples):
        row, w = tables[0].get(s.arch), s.workload
        if row and int(row["infer_img_size"]) == w.input_size:
            x = features(row, w.batch_size, w.input_size, True, w.layout == "nhwc", 0)
            train.append((i, x, np.log(s.label_ms), group[s.family]))
    ratio = [s.label_ms / s.workload.batch_size * float(r["infer_batch_size"])
             / float(r["infer_step_time"]) for s in ds.samples if s.workload.layout == "nchw"
             and (r := tables[0].get(s.arch)) and int(r["infer_img_size"]) == s.workload.input_size]
    print("per-sample time, training / inference on the 3090 (NCHW), p10 / p50 / p90: "
          + " / ".join(f"{q:.2f}" for q in np.quantile(ratio, [0.1, 0.5, 0.9])))
    infer = []
    for gpu, table in enumerate(tables):
        for arch, row in table.items():
            try:
                x = features(row, int(row["infer_batch_size"]), int(row["infer_img_size"]),
                             False, False, gpu)
                y = np.log(float(row["infer_step_time"]))
            except (ValueError, ZeroDivisionError):
                continue
            if np.all(np.isfinite(x)) and np.isfinite(y):
                fam = family_of(arch)
                infer.append((None, x, y, group.get(fam, fam)))
    print(f"{len(train)} of {len(ds)} training samples have the table's columns; "
          f"{len(infer)} inference rows from {len(tables)} tables")

    for name, extra in (("training rows only", []), ("+ inference rows", infer)):
        apes = []
        for _, test in make_splits(ds, "family"):
            test = set(test.tolist())
            held = {r[3] for r in train if r[0] in test}
            fit = [r for r in train + extra if r[0] not in test and r[3] not in held]
            ev = [r for r in train if r[0] in test]
            booster = lgb.train(PARAMS, lgb.Dataset(np.array([r[1] for r in fit]),
                                                    np.array([r[2] for r in fit])), ROUNDS)
            err = booster.predict(np.array([r[1] for r in ev])) - np.array([r[2] for r in ev])
            apes.append(100 * np.mean(np.abs(np.expm1(err))))
        print(f"{name:20s} MAPE % per fold {np.round(apes, 2).tolist()} "
              f"mean {np.mean(apes):.2f}")


if __name__ == "__main__":
    main()
