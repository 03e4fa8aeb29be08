"""Convolutions and batch norms priced at the shares a lent GPU's sweep measured: adopted or
not, per arithmetic (pre-registered: docs/studies/cnn-kernels.md).

    python benchmarks/bench_cnn_kernels.py --sweep data/<gpu slug>/kernels.jsonl.xz \
        --lease data/derived/<gpu slug>-amp-bf16-fused=<device> \
        --lease data/derived/<gpu slug>-fp32-fused=<device> --out benchmarks/results/cnn-kernels

The candidate: the shipped step model with `cnn_kernels` (`gpu.cnn_kernels.fit` on the sweep's
NCHW rows), which prices convolutions and batch norms on GPUs of the sweep's architecture;
nothing else changes. Written to OUT/candidate; every set below priced with and without it.

The rule (written before any sweep measured these kernels), decided for each arithmetic apart
(bf16: the AMP steps; fp32: the fp32 steps, their convolutions in TF32):
1. the lease's own steps at that precision (`--lease`, never looked at), the rows of its GPU
   set (224 px and up: steps the GPU's work fills, where kernels' prices show) whose model
   has a convolution: MAPE falls by at least 3 points;
2. no set at that precision rises by more than 0.5 point, over all its rows or its CNN rows:
   the lease's and the Hopper sets of `HOPPER` (the H100's two leases, the H200's).
An arithmetic that passes both is adopted: the shipped step model gains its constants (`mdot
gpu-fit --cnn-kernels`); one that fails is reported. If neither passes, the code priced here
is deleted and the sweep's rows stay.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_unaligned_gemms import write_candidate  # noqa: E402

GPU_SET_PX = 224  # the kit's GPU set: images of this side and up
# the Hopper sets the rule guards: (derived dataset, catalog device)
HOPPER = (("data/derived/gpu-nvidia-h100-80gb-hbm3-lease-2-amp-bf16-fused", "h100 sxm"),
          ("data/derived/gpu-nvidia-h100-80gb-hbm3-lease-2-confirm-amp-bf16-fused", "h100 sxm"),
          ("data/derived/gpu-nvidia-h100-80gb-hbm3-amp-bf16-fused", "h100 sxm"),
          ("data/derived/gpu-nvidia-h200-amp-bf16-fused", "h200 sxm"),
          ("data/derived/gpu-nvidia-h200-core-amp-bf16-fused", "h200 sxm"),
          ("data/derived/gpu-nvidia-h100-80gb-hbm3-lease-2-fp32-fused", "h100 sxm"),
          ("data/derived/gpu-nvidia-h100-80gb-hbm3-lease-2-confirm-fp32-fused", "h100 sxm"),
          ("data/derived/gpu-nvidia-h100-80gb-hbm3-fp32-fused", "h100 sxm"),
          ("data/derived/gpu-nvidia-h200-fp32-fused", "h200 sxm"))


def scored(dataset: str, device: str, models: dict) -> dict:
    """MAPE and median ratio of every NCHW step of `dataset` priced by each of `models`, over all
    rows, the rows whose model has a convolution (`cnn`) and those of them at 224 px and up
    (`cnn_gpu_set`); the set's precisions."""
    from mdot_jax.data.dataset import load_dataset
    from mdot_jax.gpu import catalog
    from mdot_jax.gpu.spec_sheet import price

    gpu, rows = catalog.find(device), []
    for s in load_dataset(dataset).samples:
        if s.workload.layout != "nchw":  # the candidate's rows are NCHW (the page's rule)
            continue
        pred = {name: price(s.seq, gpu, m, precision=s.workload.precision, optimizer="sgd",
                            fit=False).iteration_ms for name, m in models.items()}
        rows.append((s.label_ms, pred, bool(np.isin(s.seq.op_names, ["Conv"]).any()),
                     s.workload.precision, s.workload.input_size or 0))
    out: dict = dict(precisions=sorted({r[3] for r in rows}))
    for part, keep in (("all", lambda r: True), ("cnn", lambda r: r[2]),
                       ("cnn_gpu_set", lambda r: r[2] and r[4] >= GPU_SET_PX)):
        chosen = [r for r in rows if keep(r)]
        if chosen:
            measured = np.asarray([r[0] for r in chosen])
            out[part] = {name: dict(
                n=len(chosen), mape=float(100 * np.mean(np.abs(
                    np.asarray([r[1][name] for r in chosen]) / measured - 1))),
                median_ratio=float(np.median(np.asarray([r[1][name] for r in chosen])
                                             / measured))) for name in models}
    return out


def decide(arithmetic: str, lease: dict, sets: dict) -> dict:
    """The rule's two parts for one arithmetic ('bf16': AMP sets, 'fp32': fp32 sets)."""
    def mine(s):
        return any(("amp" in p or p == "bf16") == (arithmetic == "bf16")
                   for p in s["precisions"])

    ours = [s["cnn_gpu_set"] for s in lease.values() if mine(s) and "cnn_gpu_set" in s]
    part_1 = bool(ours) and all(s["candidate"]["mape"] <= s["status_quo"]["mape"] - 3.0
                                for s in ours)
    rises = {f"{name} {part}": round(s[part]["candidate"]["mape"]
                                     - s[part]["status_quo"]["mape"], 2)
             for name, s in {**lease, **sets}.items() if mine(s)
             for part in ("all", "cnn") if part in s}
    return dict(part_1=part_1, part_2=all(v <= 0.5 for v in rises.values()), rises=rises,
                adopted=part_1 and all(v <= 0.5 for v in rises.values()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", required=True, help="a lease's kernels.jsonl (or packed)")
    ap.add_argument("--lease", action="append", default=[], metavar="DATASET=DEVICE",
                    help="the lease's own resequenced steps (repeatable)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    from mdot_jax.gpu import cnn_kernels
    from mdot_jax.gpu.spec_sheet import load_step_model
    from mdot_jax.measure.kernel_sweep import read

    leases = [x.rsplit("=", 1) for x in args.lease]
    if not leases or any(len(x) != 2 for x in leases):
        raise SystemExit("--lease DATASET=DEVICE: the lease's own steps, at least once")
    fitted = dict(cnn_kernels.fit(read(args.sweep)), source=str(args.sweep))
    candidate = write_candidate(args.out, "cnn_kernels", fitted)
    models = dict(status_quo=load_step_model(), candidate=load_step_model(candidate))
    lease = {}
    for dataset, device in leases:
        lease[dataset] = scored(dataset, device, models)
        print(dataset, json.dumps(lease[dataset]), flush=True)
    sets = {}
    for dataset, device in HOPPER:
        if Path(dataset).is_dir() and dataset not in lease:
            sets[dataset] = scored(dataset, device, models)
            print(dataset, json.dumps(sets[dataset]), flush=True)
    results = dict(cnn_kernels=fitted, lease=lease, hopper=sets,
                   decision={a: decide(a, lease, sets) for a in ("bf16", "fp32")})
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results["decision"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
