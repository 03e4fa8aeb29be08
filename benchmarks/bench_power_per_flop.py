"""Do the operator trees, shown each GPU's power per FLOP, carry shaped GEMMs' speed only to
GPUs whose power holds their clocks?

    python benchmarks/bench_power_per_flop.py ../shared/datasets/neusight --onnx CACHE \
        --out benchmarks/results/power-per-flop

Why (docs/studies/shaped-gemms.md): fitting the training GPUs' transformer-shaped GEMMs (NeuSight's
ops/test linear and bmm of P4, P100, T4, V100, A100 40 GB) priced the unseen GPUs' steps from
ONNX 7.6% -> 6.0%, but the training GPUs left out 19.1% -> 21.3%: the T4 (70 W) and P4 (75 W),
whose clocks fall under a long large GEMM, were priced at the speed the others sustain. The
trees see no quantity of the GPU's power. Large fp32 GEMMs reach 0.96 of the peak on a V100,
0.89 on the A100 80 GB, 0.80 on the A100 40 GB (same chip, 300 W against 250 W), 0.73 on an
H100, 0.48 on a T4, 0.28 on an L4 (the tensor-core issue's figures): in that order falls the
board's power over its CUDA cores' fp32 peak (pJ per FLOP: 17.7, 15.4, 12.8, 10.5, 8.6, 2.4),
from the catalog's datasheet power, SMs, cores per SM and boost clock. Those figures include
the unseen GPUs' (H100, L4, A100 80 GB): set A below is blind to the candidate's fit, not to
the choice of its feature; set B (the training GPUs left out) is the blind test of both.

The candidate (written with this rule, before any run of it): `gpu_fit.fit(shaped_gemms=True,
power=True)`: the trees fitted on the training collections plus the training GPUs' rows of
NeuSight's test GEMMs, with one more feature, log10 of the board's power per fp32 FLOP/s of
its CUDA cores at boost (`gpu_ops.POWER`; the same for a tensor-core kernel's view of the
GPU). The test GPUs' (H100, L4, A100 80 GB) rows are never read. Everything else of the shipped
step model is kept (ratios, tensor-core, fused-attention and streaming constants, hosts,
split GEMMs); the band from the same procedure as the shipped one.

Sets, each priced by the shipped model and by the candidate in the same run:
A. NeuSight's protocol from ONNX: the unseen GPUs' 19 training labels (`--onnx`).
B. The training GPUs' traced labels (34), leave one GPU out: each GPU's labels priced from its
   traces by a step model (the shipped one's constants) whose trees were fitted without any
   row of that GPU (the candidate's: without its collections and its shaped GEMMs).
C. NeuSight's 4-GPU data-parallel runs (`--dp`).
D. Our fp32 steps: the H100's three kit sets and the H200's.
E. AMP steps: the H100's three kit sets and the H200's two at amp-bf16; timm's RTX 3090 table
   at amp-fp16 (`--timm`).
The rule: adopted if A and B are both lower with the candidate, and no set of C, D or E is
worse by more than 1 point of MAPE. Seed 0 (the shipped model's). Reported whatever it shows.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from mdot_jax.gpu import catalog, gpu_fit, neusight
from mdot_jax.gpu.gpu_ops import GpuOpModel, StepModel, StepPricer
from mdot_jax.gpu.spec_sheet import STEP_MODEL_DIR, load_step_model

MEASURED = {"h100 sxm": ("gpu-nvidia-h100-80gb-hbm3-fp32-fused",
                         "gpu-nvidia-h100-80gb-hbm3-lease-2-fp32-fused",
                         "gpu-nvidia-h100-80gb-hbm3-lease-2-confirm-fp32-fused"),
            "h200 sxm": ("gpu-nvidia-h200-fp32-fused",)}
AMP = {"h100 sxm": ("gpu-nvidia-h100-80gb-hbm3-amp-bf16-fused",
                    "gpu-nvidia-h100-80gb-hbm3-lease-2-amp-bf16-fused",
                    "gpu-nvidia-h100-80gb-hbm3-lease-2-confirm-amp-bf16-fused"),
       "h200 sxm": ("gpu-nvidia-h200-amp-bf16-fused", "gpu-nvidia-h200-core-amp-bf16-fused")}
TIMM = "timm-rtx3090-fused"


def candidate(root: Path, folder: Path) -> Path:
    """The shipped step model with trees fitted on the shaped GEMMs too, seeing power."""
    shipped = load_step_model(None)
    fitted = gpu_fit.fit(root, shaped_gemms=True, power=True, progress=print)
    folder.mkdir(parents=True, exist_ok=True)
    StepModel(fitted.ops, shipped.ratios, fitted.band, dict(
        shipped.info, operator_rows=fitted.info["operator_rows"], shaped_gemms=True,
        power=True)).save(folder)
    return folder


def logo(root: Path, shaped: bool) -> dict:
    """Set B: MAPE (%) of the training GPUs' traced labels, each GPU left out of the trees."""
    shipped = load_step_model(None)
    rows = gpu_fit.training_rows(root, shaped_gemms=shaped)
    seen = neusight.training_gpus(rows)
    labels = [x for x in neusight.labels(root) if x.gpu in seen]
    out = {}
    for held in seen:
        fit = [r for r in rows if r.gpu != held]
        trees = GpuOpModel.fit([r.op for r in fit], [r.dims for r in fit],
                               [catalog.find(r.gpu) for r in fit], [r.ms for r in fit], seed=0,
                               power=shaped)
        model = StepModel(trees, shipped.ratios, shipped.band, shipped.info)
        step = StepPricer(lambda o, d, g, m=model: m.kernel_ms(o, d, g, False), shipped.ratios)
        gpu = catalog.find(held)
        out[held] = [float(step.predict(x, gpu)["e2e"] / x.e2e_ms)
                     for x in labels if x.gpu == held]
        print(f"B candidate={shaped} left out {held}: {len(out[held])} labels, MAPE "
              f"{100 * np.mean(np.abs(np.asarray(out[held]) - 1)):.1f}%", flush=True)
    ratios = np.concatenate([np.asarray(v) for v in out.values()])
    return dict(mape=float(100 * np.mean(np.abs(ratios - 1))),
                median_ratio=float(np.median(ratios)),
                per_gpu={k: float(100 * np.mean(np.abs(np.asarray(v) - 1)))
                         for k, v in out.items()})


def bench(args: list[str]) -> None:
    subprocess.run([sys.executable, str(Path(__file__).parent / "bench_gpu_ops.py"), *args],
                   check=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("neusight", type=Path)
    ap.add_argument("--onnx", required=True, help="the exports' cache (bench_gpu_ops --onnx)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    out = args.out
    folder = out / "candidate-model"
    if not (folder / "step_model.json").is_file():
        candidate(args.neusight, folder)
    kit = {s: device for sets in (MEASURED, AMP) for device, names in sets.items()
           for s in names}
    result: dict = {}
    for name, model in (("shipped", STEP_MODEL_DIR), ("candidate", folder)):
        where = out / name
        common = [str(args.neusight), "--model", str(model), "--out", str(where)]
        if not (where / "onnx.json").is_file():
            bench(common + ["--onnx", args.onnx])
        if not (where / "dp.json").is_file():
            bench(common + ["--dp", args.onnx])
        for s, device in kit.items():
            if not (where / f"{s}.json").is_file():
                bench(common + ["--measured", f"data/derived/{s}", "--device", device])
        if not (where / "rtx3090.json").is_file():
            bench(common + ["--timm", f"data/derived/{TIMM}"])

        def mape(s: str, w: Path = where) -> float:
            return json.loads((w / f"{s}.json").read_text())["spec_sheet_mape"]

        r = dict(A=json.loads((where / "onnx.json").read_text())["mape"],
                 C=json.loads((where / "dp.json").read_text())["mape"],
                 D={s: mape(s) for names in MEASURED.values() for s in names},
                 E=dict({s: mape(s) for names in AMP.values() for s in names},
                        **{TIMM: mape("rtx3090")}))
        b = where / "logo.json"
        if not b.is_file():
            b.write_text(json.dumps(logo(args.neusight, name == "candidate"), indent=1))
        r["B"] = json.loads(b.read_text())
        result[name] = r
    s, c = result["shipped"], result["candidate"]
    a = (s["A"]["(unseen)"]["predicted"], c["A"]["(unseen)"]["predicted"])
    b = (s["B"]["mape"], c["B"]["mape"])
    worse = ([k for k in ("C",) if c[k] > s[k] + 1]
             + [k for d in ("D", "E") for k in s[d] if c[d][k] > s[d][k] + 1])
    result["decision"] = dict(A=a, B=b, worse_by_over_1_point=worse,
                              adopted=a[1] < a[0] and b[1] < b[0] and not worse)
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["decision"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
