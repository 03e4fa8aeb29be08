"""Channels-last steps priced at a lent GPU's measured layout ratios.

The study: docs/studies/channels-last.md.

Rule, written before any channels-last row was priced with the ratios (the study page):
timm's RTX 3090 channels-last training rows (`data/derived/timm-rtx3090-fused`, layout nhwc,
AMP fp16, SGD), each priced by the shipped step model as NCHW (before) and with the ratios
`cnn_kernels.fit_layout` takes from `--sweep` (after), in one run. Adopted if the MAPE over
every row falls by at least 3 points and neither part (models with a depthwise convolution,
the rest) rises by more than 1 point. Reported, never deciding: models with self-attention,
the whole table (both layouts), each part's median ratio, the rows within 20%. NCHW rows are
priced with the ratios too, to show them unchanged.

    python benchmarks/bench_channels_last.py \\
        --sweep data/gpu-nvidia-h100-80gb-hbm3-lease-3/kernels.jsonl.xz \\
        --out benchmarks/results/channels-last

A lease's own channels-last steps (the kit measures its GPU set's CNNs so; `after_lease.sh`):
`--dataset data/derived/<name>-amp-bf16-fused --device NAME --sweep <its sweep>`, the same
table, reported (the page's confirmation; the rule above decided the adoption).

Resumable: each priced row is appended to `--out`/rows.jsonl (its prices; the measured times
stay in the dataset). `--ship` (once adopted) writes the ratios into the shipped step model.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

DATASET = "data/derived/timm-rtx3090-fused"
FALL, RISE = 3.0, 1.0  # points: the rule's


def _part(seq) -> dict:
    """Whether the model has a depthwise convolution, and self-attention."""
    from converters.attention import attention_blocks
    from converters.sequence import CONFIG_FIELDS
    from mdot_jax.gpu.cnn_kernels import is_depthwise

    at = {name: i for i, name in enumerate(CONFIG_FIELDS)}
    convs = [c for n, c in zip(seq.op_names.tolist(), seq.config) if n == "Conv"]
    return dict(depthwise=any(is_depthwise(int(c[at["groups"]]), int(c[at["in_channels"]]),
                                           int(c[at["out_channels"]])) for c in convs),
                attention=bool(attention_blocks(seq)))


def summary(rows: list[dict]) -> dict:
    m = np.asarray([r["measured_ms"] for r in rows])
    out: dict = dict(rows=len(rows))
    for k in ("before", "after"):
        r = np.asarray([x[k] for x in rows]) / m
        out[k] = dict(mape=float(100 * np.mean(np.abs(r - 1))), median_ratio=float(np.median(r)),
                      within_20pct=int(np.sum(np.abs(r - 1) <= 0.2)))
    return out


def ship(ratios: dict, sweep: str) -> None:
    """The shipped step model's meta gains `channels_last` (and its command says how)."""
    from mdot_jax.storage.checkpoint import amend_step_model
    from mdot_jax.storage.shipped import STEP_MODEL_DIR

    def change(meta: dict) -> None:
        meta["channels_last"] = dict(ratios, source=sweep)
        meta["command"] = meta["command"].split("; channels-last:")[0] + (
            f"; channels-last: python benchmarks/bench_channels_last.py --sweep {sweep} --ship")

    amend_step_model(STEP_MODEL_DIR, change)


def main(argv: list[str] | None = None) -> int:
    from mdot_jax.data.dataset import load_dataset
    from mdot_jax.gpu import catalog, cnn_kernels
    from mdot_jax.gpu.spec_sheet import load_step_model, price
    from mdot_jax.measure import kernel_sweep

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sweep", required=True, help="a lent GPU's kernels.jsonl[.xz]")
    p.add_argument("--dataset", default=DATASET)
    p.add_argument("--device", default="rtx 3090", help="the catalog's GPU the steps ran on")
    p.add_argument("--out", required=True)
    p.add_argument("--ship", action="store_true", help="write the ratios into the shipped "
                   "step model (`channels_last`)")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shipped = load_step_model(None)
    ratios = cnn_kernels.fit_layout(kernel_sweep.read(args.sweep))
    model = dataclasses.replace(shipped, info={**shipped.info, "channels_last": ratios})
    gpu = catalog.find(args.device)
    done_path = out / "rows.jsonl"
    done = {(r["arch"], r["batch"], r["layout"]): r for r in map(
        json.loads, done_path.read_text().splitlines())} if done_path.exists() else {}
    samples = load_dataset(args.dataset).samples
    measured = {(s.arch, s.workload.batch_size, s.workload.layout): s.label_ms for s in samples}
    with open(done_path, "a") as f:
        for s in tqdm(samples, desc="pricing", unit="row"):
            w = s.workload
            if (s.arch, w.batch_size, w.layout) in done:
                continue
            how = dict(precision=w.precision, step="train", optimizer="sgd", fit=False)
            before = price(s.seq, gpu, shipped, **how).iteration_ms
            after = price(s.seq, gpu, model, layout=w.layout, **how).iteration_ms
            r = dict(arch=s.arch, batch=w.batch_size, layout=w.layout, before=before,
                     after=after, **_part(s.seq))
            f.write(json.dumps(r) + "\n")
            f.flush()
            done[s.arch, w.batch_size, w.layout] = r
    rows = [dict(r, measured_ms=measured[k]) for k, r in done.items()]
    nhwc = [r for r in rows if r["layout"] == "nhwc"]
    nchw = [r for r in rows if r["layout"] == "nchw"]
    if not nhwc:
        print(f"{args.dataset}: no channels-last steps", file=sys.stderr)
        return 2
    parts = {"all": nhwc, "with a depthwise convolution": [r for r in nhwc if r["depthwise"]],
             "without": [r for r in nhwc if not r["depthwise"]],
             "with self-attention (reported)": [r for r in nhwc if r["attention"]],
             "the whole table, both layouts (reported)": rows}
    scored = {k: summary(v) for k, v in parts.items() if v}
    fall = scored["all"]["before"]["mape"] - scored["all"]["after"]["mape"]
    rises = {k: scored[k]["after"]["mape"] - scored[k]["before"]["mape"]
             for k in ("with a depthwise convolution", "without") if k in scored}
    result = dict(
        command="python benchmarks/bench_channels_last.py --sweep " + args.sweep
                + f" --dataset {args.dataset} --device '{args.device}' --out {args.out}",
        ratios=ratios, channels_last=scored,
        nchw_unchanged=max((abs(r["after"] / r["before"] - 1) for r in nchw), default=None),
        rule=dict(fall_points=fall, rises_points=rises,
                  adopted=bool(fall >= FALL and all(v <= RISE for v in rises.values()))))
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    os.replace(tmp, out / "results.json")
    if args.ship:
        ship(ratios, args.sweep)
    for k, v in scored.items():
        print(f"{k:32s} n={v['rows']:4d}  MAPE {v['before']['mape']:.1f}% -> "
              f"{v['after']['mape']:.1f}%  median {v['before']['median_ratio']:.2f} -> "
              f"{v['after']['median_ratio']:.2f}")
    print(f"rule: fall {fall:.1f} points, rises {rises}: "
          f"{'adopted' if result['rule']['adopted'] else 'not adopted'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
