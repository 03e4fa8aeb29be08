"""A lent GPU's kernel sweep (the kit's `kernels.jsonl`, `mdot_jax.measure.kernel_sweep`) priced
kernel by kernel by the shipped step model, from the catalog row of the GPU each row names.

    python benchmarks/bench_kernel_sweep.py data/gpu-nvidia-h200/kernels.jsonl.xz \
        --out benchmarks/results/kernels-h200

The rule, written before any row was priced:
1. Nothing is fitted: the shipped `gpu-spec-sheet` model prices each kernel as
   `spec_sheet.price` does inside a step: GEMMs and batched GEMMs at tf32 / fp16 / bf16 by its
   tensor-core constants, at fp32 by its operator model; add, mul, gelu, layer norm and
   softmax by its operator model, the GPU seen at the kernel's element width.
2. Not priced, counted: fp8 GEMMs (no precision of ours runs them) and SDPA's fused attention
   (priced only inside a step, as its GEMMs).
3. Reported per kind and precision: rows, MAPE, median predicted / measured, and the same for
   the plain roofline (the spec sheet's peak for the precision and its bandwidth). No target:
   these are the first measured tensor-core kernels of their GPU; the targets are on steps.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict
from pathlib import Path

import numpy as np

from mdot_jax.gpu import catalog
from mdot_jax.gpu.spec_sheet import load_step_model
from mdot_jax.gpu.tensor_cores import ARITHMETIC, GEMM_OPS, TensorCoreGemms
from mdot_jax.gpu.work import roofline_ms
from mdot_jax.measure.kernel_sweep import read

# the sweep's kinds -> the operator model's names (`gpu.neusight.OPS`)
OPS = {"gemm": "linear", "bmm": "bmm", "add": "add", "mul": "mul", "gelu": "gelu",
       "layer_norm": "ln", "softmax": "softmax"}
WIDTH = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2}


def price(row: dict, model, gemms: TensorCoreGemms) -> tuple[float, float] | None:
    """(the model's ms, the roofline's ms) of one measured kernel, or None if not priced."""
    op, precision = OPS.get(row["kind"]), row["precision"]
    if op is None or precision not in WIDTH:
        return None
    gpu = catalog.find(row["device"])
    dims = tuple(row["dims"])
    if op in GEMM_OPS and precision in ARITHMETIC:  # on tensor cores
        seen = catalog.as_seen(gpu, gpu.tflops[precision], WIDTH[precision])
        ms = float(gemms.ms(precision, [op], [dims], [seen])[0])
    else:
        seen = catalog.as_seen(gpu, gpu.tflops["fp32"], WIDTH[precision])
        ms = float(model.ops.predict([op], [dims], [seen])[0])
    return ms, roofline_ms(op, dims, seen)


def summary(pairs: list[tuple[float, float]]) -> dict:
    r = np.asarray(pairs, np.float64)  # [N, 2]: predicted, measured
    return dict(n=len(r), mape=float(100 * np.mean(np.abs(r[:, 0] / r[:, 1] - 1))),
                median_ratio=float(np.median(r[:, 0] / r[:, 1])))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sweep", type=Path, help="a kit's kernels.jsonl (or .jsonl.xz)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    model = load_step_model(None)
    gemms = TensorCoreGemms.from_json(model.info["tensor_core_gemms"])
    model_rows, roof_rows = defaultdict(list), defaultdict(list)
    skipped: dict[str, int] = defaultdict(int)
    rows = read(args.sweep)
    for row in rows:
        key = f"{row['kind']}/{row['precision']}"
        priced = price(row, model, gemms) if row.get("ms") else None
        if priced is None:
            skipped[key] += 1
            continue
        model_rows[key].append((priced[0], row["ms"]))
        roof_rows[key].append((priced[1], row["ms"]))
    result = dict(
        command=f"python benchmarks/bench_kernel_sweep.py {args.sweep} --out {args.out}",
        devices=sorted({r["device"] for r in rows}),
        model={k: summary(v) for k, v in sorted(model_rows.items())},
        roofline={k: summary(v) for k, v in sorted(roof_rows.items())},
        not_priced=dict(sorted(skipped.items())))
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = args.out / "results.json.tmp"
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    os.replace(tmp, args.out / "results.json")
    print(f"{'kind/precision':<20} {'n':>4} {'model MAPE':>10} {'median':>7} "
          f"{'roofline MAPE':>13} {'median':>7}")
    for k, s in result["model"].items():
        r = result["roofline"][k]
        print(f"{k:<20} {s['n']:>4} {s['mape']:>9.1f}% {s['median_ratio']:>7.2f} "
              f"{r['mape']:>12.1f}% {r['median_ratio']:>7.2f}")
    print("not priced:", result["not_priced"])


if __name__ == "__main__":
    main()
