"""Each tensor at its own width under autocast: adopted or not.

    python benchmarks/bench_autocast_dtypes.py --out benchmarks/results/autocast-dtypes

Why (docs/studies/machine-host.md): with memory-bound kernels priced at the bandwidth they
measure, PyTorch's AMP steps come out too fast (the H100 and H200 GPU sets at AMP 0.82-0.84,
the H200's GPT-2 steps 0.61, its eager ones, GPU-bound, 0.54-0.64), while fp32 steps came out
right. Under AMP every elementwise kernel is priced on 2-byte tensors, but autocast keeps a
transformer's residual stream in fp32 (fp32 embeddings plus half GEMM outputs promote), and
softmax and layer norm write fp32: those kernels move 4 bytes an element.

Candidate: the shipped step model with `autocast_dtypes` (`gpu.autocast.fp32_outputs`): each
node's output dtype propagated through the graph (GEMMs and convolutions write the half type;
softmax and normalisations but batch norm fp32; any other float operator fp32 where it reads
an fp32 tensor or only graph inputs and weights, the half type otherwise), every non-GEMM
kernel priced at its output's width, and every fp32 tensor a GEMM or convolution reads cast
(`gpu.autocast.casts`). Nothing is fitted: the host stays the shipped one (fitted with the
status quo's widths on steps that include AMP ones; not refitted, to keep the comparison to
one change).

The rule, written before any set is priced with the candidate:
1. Four confirming sets, all PyTorch at AMP (the only steps the change touches): (a) our H100
   GPU set at AMP bf16 (224 px / 256 tokens, lease 2 and its confirming machine; 30 steps),
   (b) the H200's AMP bf16 GPU set (27), (c) timm's RTX 3090 NCHW rows (804, AMP fp16), (d) the
   H200's 17 GPT-2 LLM steps (`data/gpu-nvidia-h200/llm-steps.jsonl`, `bench_llm_steps.py`).
2. Adopted if the candidate's MAPE is lower on at least 3 of the 4 and higher on none by more
   than 2 points. Reported: transformers and CNNs apart, the small AMP steps of each machine
   (in the host's fit), the median ratios.
Seeds: none; nothing is drawn or fitted.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_llm_steps import price as price_llm  # noqa: E402
from bench_tensor_cores import TIMM, steps  # noqa: E402

H100_AMP = ("gpu-nvidia-h100-80gb-hbm3-lease-2-amp-bf16-fused",
            "gpu-nvidia-h100-80gb-hbm3-lease-2-confirm-amp-bf16-fused")
H200_AMP = ("gpu-nvidia-h200-amp-bf16-fused",)
SMALL = {"h100_small": (("gpu-nvidia-h100-80gb-hbm3-amp-bf16-fused",) + H100_AMP, "h100 sxm"),
         "h200_small": (("gpu-nvidia-h200-core-amp-bf16-fused",) + H200_AMP, "h200 sxm")}
LLM = Path("data/gpu-nvidia-h200/llm-steps.jsonl")


def gpu_set(s) -> bool:
    return s.workload.input_size >= 128


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path("data/derived"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/autocast-dtypes"))
    args = ap.parse_args(argv)
    from mdot_jax.gpu.gpu_ops import StepModel
    from mdot_jax.gpu.spec_sheet import STEP_MODEL_DIR

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "results.json"
    r = json.loads(path.read_text()) if path.exists() else {}

    def save():
        path.write_text(json.dumps(r, indent=1) + "\n")

    candidate = args.work / "candidate"
    if candidate.exists():
        shutil.rmtree(candidate)
    shutil.copytree(STEP_MODEL_DIR, candidate, ignore=shutil.ignore_patterns("README.md"))
    meta = json.loads((candidate / StepModel.META).read_text())
    (candidate / StepModel.META).write_text(json.dumps(dict(meta, autocast_dtypes=True)) + "\n")
    ckpts = {"status_quo": STEP_MODEL_DIR, "candidate": candidate}
    models = {n: StepModel.load(c) for n, c in ckpts.items()}
    for name, sets, device, keep, layout in (
            ("h100_amp_gpu_set", H100_AMP, "h100 sxm", gpu_set, None),
            ("h200_amp_gpu_set", H200_AMP, "h200 sxm", gpu_set, None),
            ("rtx3090_timm_nchw", (TIMM,), "rtx 3090", None, "nchw"),
            *((n, sets, device, lambda s: not gpu_set(s), None)
              for n, (sets, device) in SMALL.items())):
        if name not in r:
            print(f"pricing {name}", file=sys.stderr)
            r[name] = steps([args.data / d for d in sets], device, models, layout, keep)
            save()
    if "h200_llm_steps" not in r:
        rows = [json.loads(x) for x in LLM.read_text().splitlines() if x.strip()]
        r["h200_llm_steps"] = {}
        for n, c in ckpts.items():
            priced, _ = price_llm(rows, str(c))
            ratio = np.asarray([p["predicted_ms"] / p["measured_ms"] for p in priced])
            r["h200_llm_steps"][n] = dict(rows=len(ratio), mape=float(100 * np.mean(
                np.abs(ratio - 1))), median_ratio=float(np.median(ratio)))
        save()
    sets = {k: {n: r[k]["all"][n]["mape"] for n in ckpts}
            for k in ("h100_amp_gpu_set", "h200_amp_gpu_set", "rtx3090_timm_nchw")}
    sets["h200_llm_steps"] = {n: v["mape"] for n, v in r["h200_llm_steps"].items()}
    delta = {k: v["candidate"] - v["status_quo"] for k, v in sets.items()}
    lower = sum(d < 0 for d in delta.values())
    r["decision"] = dict(sets=sets, delta=delta, lower=lower,
                         adopted=bool(lower >= 3 and max(delta.values()) <= 2.0))
    save()
    print(json.dumps(r["decision"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
