"""Does pricing a GEMM as no dearer than its two halves fix the operator model's large GEMMs?

    python benchmarks/bench_split_gemms.py ../shared/datasets/neusight --onnx /tmp/ns-onnx \
        --out benchmarks/results/split-gemms

Why: the GPU operator model (LightGBM on the log of measured / roofline, fitted on NeuSight's
fp32 operators of P4, P100, T4, V100, A100 40 GB) prices some large fp32 GEMMs far slower than
their own training GPU ran them: on the V100, GEMMs with an output side of 38k-65k (a
vocabulary's projection) at 0.25-0.38 of the peak where NeuSight measured 0.65-0.78, and BERT-
Large's 30,522-word head at 61% where its trace ran at 96%. The trees are flat outside what
they saw. A GEMM can always run as two GEMMs of half its larger output side, so its price
should never exceed twice its half's.

The candidate (written with this rule, before any run of it): the step model's
`split_gemms` = 4: every GEMM (linear, bmm) the operator model prices is priced as the least
of its own price and 2^j times the price of its 1/2^j piece (j = 1..4; each halving takes the
larger of M and N, `gpu_ops.split_gemms`). Tensor-core GEMMs (priced by measured constants)
and convolutions are untouched.

The rule: adopted if, on the five training GPUs' held-out operators (NeuSight's ops/test split
of linear and bmm, never fitted), the MAPE is lower with the candidate, and the ONNX path's
MAPE over the training GPUs' own training labels (V100's three) is not higher. Reported
whatever it shows, once decided: the ONNX path on the unseen GPUs (H100 SXM, L4, A100 80 GB;
NeuSight's protocol), beside the shipped model's `benchmarks/results/gpu-neusight/onnx.json`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from mdot_jax.gpu import catalog, neusight
from mdot_jax.gpu.gpu_ops import SPLIT_DEPTH
from mdot_jax.gpu.spec_sheet import STEP_MODEL_DIR, load_step_model
from mdot_jax.storage.checkpoint import step_model_copy

DEPTH = SPLIT_DEPTH


def candidate(folder: Path) -> Path:
    """A copy of the shipped step model with `split_gemms` set."""
    return step_model_copy(STEP_MODEL_DIR, folder, split_gemms=DEPTH)


def ops_mape(root: Path, folder: Path | None) -> dict:
    """MAPE (%) of the training GPUs' held-out linear and bmm operators, per op and pooled."""
    model = load_step_model(folder)
    fitted = set(model.info["fitted_gpus"])
    rows = [r for r in neusight.read(root) if r.split == "test" and r.op in ("linear", "bmm")
            and r.gpu in fitted]
    pred = model.kernel_ms([r.op for r in rows], [r.dims for r in rows],
                           [catalog.find(r.gpu) for r in rows], False)
    ape = 100 * np.abs(pred / np.asarray([r.ms for r in rows]) - 1)
    out = {op: float(ape[[r.op == op for r in rows]].mean()) for op in ("linear", "bmm")}
    return dict(out, pooled=float(ape.mean()), rows=len(rows))


def onnx_path(root: Path, cache: Path, folder: Path | None, out: Path) -> dict:
    """The ONNX path's MAPE per GPU and for the fitted and unseen GPUs (`bench_gpu_ops`)."""
    if not (out / "onnx.json").exists():
        subprocess.run([sys.executable, str(Path(__file__).with_name("bench_gpu_ops.py")),
                        str(root), "--onnx", str(cache), "--out", str(out)]
                       + (["--model", str(folder)] if folder else []), check=True)
    return json.loads((out / "onnx.json").read_text())["mape"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("neusight", type=Path)
    ap.add_argument("--onnx", type=Path, required=True, help="the exports' cache")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.out / "work"
    cand = candidate(work / "candidate")
    ops = {"shipped": ops_mape(args.neusight, None), "candidate": ops_mape(args.neusight, cand)}
    print("held-out operators of the training GPUs:", json.dumps(ops), flush=True)
    steps = {"shipped": onnx_path(args.neusight, args.onnx, None, work / "onnx-shipped"),
             "candidate": onnx_path(args.neusight, args.onnx, cand, work / "onnx-candidate")}
    fitted = {k: v["(fitted)"]["predicted"] for k, v in steps.items()}
    adopted = ops["candidate"]["pooled"] < ops["shipped"]["pooled"] and \
        fitted["candidate"] <= fitted["shipped"]
    result = dict(rule=__doc__.split("The rule: ")[1].split("\n\n")[0].replace("\n", " "),
                  depth=DEPTH, ops=ops, onnx_fitted=fitted, adopted=adopted,
                  onnx={k: v for k, v in steps.items()})
    (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    shutil.rmtree(work / "candidate")
    print(json.dumps(dict(ops=ops, onnx_fitted=fitted, adopted=adopted), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
