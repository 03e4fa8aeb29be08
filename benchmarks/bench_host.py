"""The host's time to issue a kernel, fitted on our H100 steps: adopted or not.

    python benchmarks/bench_host.py --vtrain ../shared/datasets/vtrain --out benchmarks/results/host

Eager PyTorch (and Megatron-LM, which runs in it) issues kernels from Python one at a time; a
step whose kernels are shorter than that waits on the host (`gpu.spec_sheet.launch_bound`).
The candidate is the shipped `gpu-spec-sheet` model with `host_ms_per_kernel` set to the value
`gpu_fit.fit_host` finds on every measured step of our H100 kit (both leases, AMP bf16 and
fp32, `data/derived/gpu-nvidia-h100-80gb-hbm3-*-fused`), the shipped model pricing them.

The rule, written before any confirming set was priced with a host term:
1. Three confirming sets, each priced by the shipped model and the candidate: (a) vTrain's
   1,440 single-node rows and (b) its 109 multi-node rows, both with `--framework megatron`
   (`bench_vtrain.py`; seen before, nothing here chosen on them); (c) timm's RTX 3090 NCHW
   rows (AMP fp16, PyTorch 1.12 on another machine).
2. Adopted if the candidate's MAPE is lower on at least 2 of the 3. The H100 steps it was
   fitted on are reported, not used to decide.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_tensor_cores import TIMM, steps, vtrain  # noqa: E402

H100 = ("gpu-nvidia-h100-80gb-hbm3-amp-bf16-fused", "gpu-nvidia-h100-80gb-hbm3-fp32-fused",
        "gpu-nvidia-h100-80gb-hbm3-lease-2-amp-bf16-fused",
        "gpu-nvidia-h100-80gb-hbm3-lease-2-confirm-amp-bf16-fused",
        "gpu-nvidia-h100-80gb-hbm3-lease-2-confirm-fp32-fused",
        "gpu-nvidia-h100-80gb-hbm3-lease-2-fp32-fused")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vtrain", type=Path, required=True)
    ap.add_argument("--data", type=Path, default=Path("data/derived"))
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    from mdot_jax.gpu import gpu_fit
    from mdot_jax.gpu.gpu_ops import StepModel
    from mdot_jax.gpu.spec_sheet import STEP_MODEL_DIR, load_step_model

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}  # resumable by set

    def save():
        path.write_text(json.dumps(results, indent=1) + "\n")

    shipped = load_step_model()
    candidate = args.out / "candidate"
    if "host_ms_per_kernel" not in results:
        results["host_ms_per_kernel"] = gpu_fit.fit_host(
            shipped, [str(args.data / d) for d in H100], "h100 sxm", progress=print)
        save()
    if not candidate.exists():
        shutil.copytree(STEP_MODEL_DIR, candidate, ignore=shutil.ignore_patterns("README.md"))
        meta = json.loads((candidate / StepModel.META).read_text())
        meta.update(host_ms_per_kernel=results["host_ms_per_kernel"],
                    host_source=f"{', '.join(H100)} (h100 sxm)")
        (candidate / StepModel.META).write_text(json.dumps(meta, indent=1) + "\n")
    models = {"status_quo": shipped, "candidate": StepModel.load(candidate)}
    for name, datasets, device, layout in (("rtx3090_timm_nchw", (TIMM,), "rtx 3090", "nchw"),
                                           ("h100_fitted_reported", H100, "h100 sxm", None)):
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
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
