"""Memory-bound kernels at the H200's measured share of the bandwidth, the host apart: adopted
or not.

    python benchmarks/bench_streaming.py --vtrain ../shared/datasets/vtrain \
        --neusight ../shared/datasets/neusight --onnx /tmp/ns-onnx \
        --out benchmarks/results/streaming-h200

The shipped model prices every small elementwise, normalisation and softmax kernel at 40-60
us (the LightGBM operator model's floor, learned from NeuSight's older GPUs); the H200's kernel
sweep measured them at 15-30 us a single launch, the host's issue time included, and a host
term fitted alone could not bind under that floor (docs/studies/host-per-kernel.md).

The candidate: the shipped model with (1) `streaming_kernels` (`gpu.streaming`: per class,
elementwise and row-wise, the constants fitted on the H200 sweep's measured add, mul, gelu,
layer norm and softmax kernels at fp32 and bf16; `data/gpu-nvidia-h200/kernels.jsonl.xz`)
pricing every memory-bound kernel, the optimizer's passes and autocast's casts too, and
(2) `host_ms_per_kernel` fitted by `gpu_fit.fit_host` on the H200's 216 steps priced with (1).
Everything fitted is the H200's: its results become fitted ones.

The rule, written before any confirming set was priced with the candidate:
1. Five confirming sets, each priced by the shipped model and by the candidate: (a) vTrain's
   1,440 single-node rows and (b) its 109 multi-node rows with `--framework megatron`; (c) the
   289 steps of our two H100 leases (AMP bf16 and fp32); (d) timm's RTX 3090 NCHW rows (804,
   AMP fp16); (e) NeuSight's training labels of its unseen GPUs (H100, L4, A100 80 GB) from
   ONNX (`bench_gpu_ops.py --onnx`, fp32 fwd-bwd).
2. Adopted if the candidate's MAPE is lower on at least 3 of the 5 and higher on none by more
   than 2 points. The H200's steps it was fitted on are reported, not used to decide.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_kernel_sweep import read  # noqa: E402
from bench_tensor_cores import TIMM, steps, vtrain  # noqa: E402

SWEEP = Path("data/gpu-nvidia-h200/kernels.jsonl.xz")
H200 = ("gpu-nvidia-h200-core-amp-bf16-fused", "gpu-nvidia-h200-amp-bf16-fused",
        "gpu-nvidia-h200-fp32-fused")
H100 = ("gpu-nvidia-h100-80gb-hbm3-amp-bf16-fused", "gpu-nvidia-h100-80gb-hbm3-fp32-fused",
        "gpu-nvidia-h100-80gb-hbm3-lease-2-amp-bf16-fused",
        "gpu-nvidia-h100-80gb-hbm3-lease-2-confirm-amp-bf16-fused",
        "gpu-nvidia-h100-80gb-hbm3-lease-2-confirm-fp32-fused",
        "gpu-nvidia-h100-80gb-hbm3-lease-2-fp32-fused")


def neusight_onnx(root: Path, cache: Path, model: str | None, out: Path) -> float:
    """MAPE of NeuSight's unseen GPUs' training labels, from ONNX, priced with `model`."""
    if not (out / "onnx.json").exists():
        subprocess.run([sys.executable, str(Path(__file__).with_name("bench_gpu_ops.py")),
                        str(root), "--onnx", str(cache), "--out", str(out)]
                       + (["--model", model] if model else []), check=True)
    return json.loads((out / "onnx.json").read_text())["mape"]["(unseen)"]["predicted"]


def decide(r: dict) -> dict:
    """The rule's second point: each set's change of MAPE (points) and the decision."""
    delta = {f"vtrain_{s}": r["vtrain_megatron/candidate"][f"{s}/all"]["mape"]
             - r["vtrain_megatron/status_quo"][f"{s}/all"]["mape"] for s in ("single", "multi")}
    for k in ("h100", "rtx3090_timm_nchw"):
        delta[k] = r[k]["all"]["candidate"]["mape"] - r[k]["all"]["status_quo"]["mape"]
    delta["neusight_onnx_unseen"] = (r["neusight_onnx_unseen"]["candidate"]
                                     - r["neusight_onnx_unseen"]["status_quo"])
    lower = sum(v < 0 for v in delta.values())
    return dict(delta, lower=lower,
                adopted=bool(lower >= 3 and max(delta.values()) <= 2.0))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vtrain", type=Path, required=True)
    ap.add_argument("--neusight", type=Path, required=True)
    ap.add_argument("--onnx", type=Path, required=True, help="bench_gpu_ops.py's export cache")
    ap.add_argument("--data", type=Path, default=Path("data/derived"))
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    from mdot_jax.gpu import gpu_fit, streaming
    from mdot_jax.gpu.gpu_ops import StepModel
    from mdot_jax.gpu.spec_sheet import STEP_MODEL_DIR, load_step_model

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}  # resumable by set

    def save():
        path.write_text(json.dumps(results, indent=1) + "\n")

    shipped = load_step_model()
    candidate = args.out / "candidate"
    if not candidate.exists():
        results["streaming_kernels"] = streaming.fit(read(SWEEP))
        shutil.copytree(STEP_MODEL_DIR, candidate, ignore=shutil.ignore_patterns("README.md"))
        meta = json.loads((candidate / StepModel.META).read_text())
        meta["streaming_kernels"] = dict(constants=results["streaming_kernels"],
                                         gpu="nvidia-h200-sxm", source=str(SWEEP))
        (candidate / StepModel.META).write_text(json.dumps(meta, indent=1) + "\n")
        results["host_ms_per_kernel"] = gpu_fit.fit_host(
            StepModel.load(candidate), [str(args.data / d) for d in H200], "h200 sxm",
            progress=print)
        meta.update(host_ms_per_kernel=results["host_ms_per_kernel"],
                    host_source=f"{', '.join(H200)} (h200 sxm)")
        (candidate / StepModel.META).write_text(json.dumps(meta, indent=1) + "\n")
        save()
    models = {"status_quo": shipped, "candidate": StepModel.load(candidate)}
    for name, datasets, device, layout in (("h100", H100, "h100 sxm", None),
                                           ("rtx3090_timm_nchw", (TIMM,), "rtx 3090", "nchw"),
                                           ("h200_fitted_reported", H200, "h200 sxm", None)):
        if name not in results:
            print(f"pricing {name}", file=sys.stderr)
            results[name] = steps([args.data / d for d in datasets], device, models, layout)
            save()
    for model, checkpoint in (("status_quo", None), ("candidate", str(candidate))):
        key = f"vtrain_megatron/{model}"
        if key not in results:
            results[key] = vtrain(args.vtrain, checkpoint, args.out / f"vtrain-{model}",
                                  framework="megatron")
            save()
    results["neusight_onnx_unseen"] = {
        model: neusight_onnx(args.neusight, args.onnx, checkpoint, args.out / f"ns-{model}")
        for model, checkpoint in (("status_quo", None), ("candidate", str(candidate)))}
    results["decision"] = decide(results)
    save()
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
