"""The kernels eager PyTorch's dispatcher runs in a training step, priced: adopted or not.

    python benchmarks/bench_dispatcher_kernels.py --neusight ../shared/datasets/neusight \
        --onnx /tmp/ns-onnx --out benchmarks/results/dispatcher-kernels

Why: the aten operators a training step dispatches (logged on a CPU with a TorchDispatchMode,
fp32, the kit's models and loop) differ from the kernels `gpu.spec_sheet` prices in ways that
do not depend on the device, each read from PyTorch's own code:
1. gradient accumulation: the kit's loop (and PyTorch >= 2.0's default) calls
   `zero_grad(set_to_none=True)`, so the backward's AccumulateGrad takes each weight's
   gradient as it is (no kernel; ResNet-50: 0 of the 107 priced). Gradients are added only
   into ones that exist: PyTorch 1.x's zero_grad (timm's RTX 3090 rows, PyTorch 1.12),
   NeuSight's loop (25 backward passes, never zeroed), and every micro-batch after the first
   of gradient accumulation; there every weight's is added, those behind a view (a Linear's
   transposed weight) too, which the status quo missed.
2. nn.Linear's bias is added inside its GEMM (`at::linear` -> `addmm`, cuBLASLt's bias
   epilogue, for a contiguous input of rank 2 or more since PyTorch 1.12 / 2.1): the exported
   MatMul + Add(bias) runs one kernel forward (72 priced Adds of BERT-base never run); the
   bias gradient's reduction stays in the backward. Under autocast the bias is cast to the
   half type by a kernel of its own, forward and back, as is a Gemm's (HF GPT-2's Conv1D).
3. a training-mode batch norm increments its `num_batches_tracked`: one kernel a step each.
Megatron's kernels (`framework="megatron"`) are untouched.

Candidate: the shipped step model with those kernels (`dispatcher_kernels` in its meta) and
the pytorch host refitted with them as `bench_machine_host.py` fitted it
(`gpu_fit.best_host` over the launch-bound core-set steps, 64 px / 32 tokens, of the three
lease machines pooled); the megatron host as shipped. Baseline: the shipped model.

The rule, written and committed before any set below is priced with the candidate:
1. Four confirming sets, none in any fit, each priced by both: (a) our H100 GPU set, 224 px /
   256 tokens, of the second lease and its confirming machine (AMP bf16 and fp32); (b) the
   H200 lease's GPU set, 224 px / 256 tokens (AMP bf16 and fp32); (c) timm's RTX 3090 NCHW
   rows (AMP fp16, gradients accumulated: PyTorch 1.12); (d) NeuSight's unseen GPUs' training
   labels from ONNX (fp32 forward and backward, gradients accumulated).
2. Adopted (the shipped meta gains `dispatcher_kernels` and the refitted host) if the
   candidate's MAPE is lower on at least 3 of the 4 and higher on none by more than 2 points;
   otherwise nothing, and the code of the candidate is deleted.
3. Reported whatever the outcome: the core-set steps per machine (fitted), transformers and
   CNNs apart, the pytorch host refitted on the shipped kernels (it should reproduce the
   shipped one). vTrain's rows are priced with Megatron's kernels, which the candidate leaves
   alone: not re-run.
Seeds: none are drawn; the host is a grid search. Resumable by stage from `--out`/results.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_machine_host import LEASES, checkpoint, core, neusight_onnx  # noqa: E402
from bench_tensor_cores import TIMM, steps  # noqa: E402

FLAG = "dispatcher_kernels"


def decide(sets: dict) -> dict:
    """The rule's second point on `sets` (name -> {model: MAPE})."""
    delta = {k: v["candidate"] - v["shipped"] for k, v in sets.items()}
    lower = sum(d < 0 for d in delta.values())
    return dict(delta=delta, lower=lower,
                adopted=lower >= 3 and max(delta.values()) <= 2.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--neusight", type=Path, required=True)
    ap.add_argument("--onnx", type=Path, required=True, help="bench_gpu_ops.py's export cache")
    ap.add_argument("--data", type=Path, default=Path("data/derived"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ship", action="store_true", help="once decided: write what the rule "
                    "adopted into the shipped step model's meta")
    ap.add_argument("--work", type=Path, default=Path("/tmp/dispatcher-kernels"))
    args = ap.parse_args(argv)
    from mdot_jax.data.dataset import load_dataset
    from mdot_jax.gpu import catalog, gpu_fit
    from mdot_jax.gpu.gpu_ops import StepModel
    from mdot_jax.gpu.spec_sheet import STEP_MODEL_DIR

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "results.json"
    r = json.loads(path.read_text()) if path.exists() else {}

    def save():
        path.write_text(json.dumps(r, indent=1) + "\n")

    flagged = checkpoint(STEP_MODEL_DIR, args.work / "flagged", **{FLAG: True})
    for name, base in (("shipped", STEP_MODEL_DIR), ("candidate", flagged)):
        key = f"{name}/host_pytorch"  # (ms, MAPE %, MAPE at 1 us) over the pooled core sets
        if key not in r:
            model = StepModel.load(base)
            pooled = [k for sets, device in LEASES.values() for k in gpu_fit.step_kernels(
                model, [s for d in sets for s in load_dataset(str(args.data / d)).samples
                        if core(s)], catalog.find(device))]
            r[key] = gpu_fit.best_host(pooled)
            save()
        print(f"{name}: pytorch host {1e3 * r[key][0]:.1f} us", file=sys.stderr)
    shipped = StepModel.load(STEP_MODEL_DIR)
    ckpts = {"shipped": STEP_MODEL_DIR, "candidate": checkpoint(
        STEP_MODEL_DIR, args.work / "candidate", **{FLAG: True}, host_ms_per_kernel=dict(
            shipped.info["host_ms_per_kernel"], pytorch=r["candidate/host_pytorch"][0]))}
    models = {n: StepModel.load(c) for n, c in ckpts.items()}
    for name, sets, device, keep, layout, accumulated in (
            ("h100_gpu_set", LEASES["h100-lease-2"][0], "h100 sxm", lambda s: not core(s),
             None, False),
            ("h200_gpu_set", LEASES["h200"][0], "h200 sxm", lambda s: not core(s), None, False),
            ("rtx3090_timm_nchw", (TIMM,), "rtx 3090", None, "nchw", True),
            ("h100_lease_1_core", LEASES["h100-lease-1"][0], "h100 sxm", core, None, False),
            ("h100_lease_2_core", LEASES["h100-lease-2"][0], "h100 sxm", core, None, False),
            ("h200_core", LEASES["h200"][0], "h200 sxm", core, None, False)):
        if name not in r:
            print(f"pricing {name}", file=sys.stderr)
            r[name] = steps([args.data / d for d in sets], device, models, layout, keep,
                            accumulate_grads=accumulated)
            save()
    if "neusight_onnx_unseen" not in r:
        r["neusight_onnx_unseen"] = {
            n: neusight_onnx(args.neusight, args.onnx, None if n == "shipped" else c,
                             args.out / f"ns-{n}") for n, c in ckpts.items()}
        save()
    sets = {k: {n: r[k]["all"][n]["mape"] for n in ckpts}
            for k in ("h100_gpu_set", "h200_gpu_set", "rtx3090_timm_nchw")}
    sets["neusight_onnx_unseen"] = r["neusight_onnx_unseen"]
    r["decision"] = decide(sets)
    save()
    print(json.dumps(dict(sets=sets, decision=r["decision"]), indent=1))
    if args.ship and r["decision"]["adopted"]:
        meta_path = STEP_MODEL_DIR / StepModel.META
        meta = json.loads(meta_path.read_text())
        meta[FLAG] = True
        meta["host_ms_per_kernel"]["pytorch"] = r["candidate/host_pytorch"][0]
        meta["host_source"] += ("; pytorch refitted the same way with the dispatcher's kernels, "
                                "benchmarks/bench_dispatcher_kernels.py")
        meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
