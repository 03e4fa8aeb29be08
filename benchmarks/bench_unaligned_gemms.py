"""Linear layers whose features are not a multiple of 16 bytes (GPT-2's vocabulary of 50,257,
BERT's 30,522), priced at the slowdown a lent GPU's sweep measured: adopted or not.

    python benchmarks/bench_unaligned_gemms.py --sweep data/<gpu slug>/kernels.jsonl \
        --steps data/<gpu slug>/llm-steps.jsonl --out benchmarks/results/unaligned-gemms

Pre-registered (docs/studies/unaligned-gemms.md), before any sweep measured such a layer. The
shipped model prices every GEMM as if its rows were aligned; cuBLAS reads rows that start at
addresses no 16-byte vector load can use with narrower loads and other kernels. The kit's
sweep times `linear-train` (a language model's head: forward and both gradients) at
unaligned vocabularies beside aligned twins, at fp32, tf32, fp16 and bf16.

The candidate: the shipped model with `unaligned_gemms` (`tensor_cores.fit_unaligned` on that
sweep): on GPUs of the sweep's architecture, a linear layer whose in or out features are not
a multiple of 16 bytes' elements at the step's arithmetic has its three GEMMs times the
measured ratio (never below 1); nothing else changes. This script fits it, writes it to
OUT/candidate (for `bench_gpu_ops.py --model`), prices the lease's LLM steps with and without
it, and the H200 lease's 17 (development: looked at before) apart.

The rule (both parts, written before the sweep's rows exist):
1. The lease's LLM steps (never looked at): MAPE falls by at least 2 points.
2. No other Hopper set up by more than 0.5 point: the H100's and the H200's GPU sets (AMP
   bf16 and fp32) and NeuSight's H100 training rows from ONNX (`bench_gpu_ops.py ... --model
   OUT/candidate`, each against the same command without `--model`).
If the sweep's half-precision ratio is under 1.1, nothing is priced differently: reported, not
adopted.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_llm_steps import price, summarize  # noqa: E402

DEVELOPMENT = Path("data/gpu-nvidia-h200/llm-steps.jsonl")


def write_candidate(out: Path, key: str, fitted: dict) -> Path:
    """OUT/candidate: the shipped step model with `fitted` as its `key` (a candidate a
    pre-registered study prices with); one this function wrote before is replaced, nothing
    else."""
    from mdot_jax.gpu.spec_sheet import STEP_MODEL_DIR
    from mdot_jax.storage.checkpoint import step_model_copy

    out.mkdir(parents=True, exist_ok=True)
    return step_model_copy(STEP_MODEL_DIR, out / "candidate", **{key: fitted})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", required=True, help="a lease's kernels.jsonl (or packed)")
    ap.add_argument("--steps", type=Path, required=True, help="the lease's llm-steps.jsonl")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    from mdot_jax.gpu.tensor_cores import fit_unaligned
    from mdot_jax.measure.kernel_sweep import read

    fitted = dict(fit_unaligned(read(args.sweep)), source=str(args.sweep))
    candidate = write_candidate(args.out, "unaligned_gemms", fitted)
    results: dict = dict(unaligned_gemms=fitted)
    for name, path in (("lease", args.steps), ("development", DEVELOPMENT)):
        if name == "development" and path.resolve() == args.steps.resolve():
            continue
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        priced = {m: price(rows, c)[0] for m, c in (("status_quo", None),
                                                     ("candidate", str(candidate)))}
        results[f"{name}_steps"] = {m: summarize(p) for m, p in priced.items()}
        results[f"{name}_steps"]["changed"] = sum(
            a["predicted_ms"] != b["predicted_ms"]
            for a, b in zip(priced["status_quo"], priced["candidate"]))
    lease = results["lease_steps"]
    half = min(fitted["ratio"].get(p, 1.0) for p in ("fp16", "bf16"))
    results["part_1_holds"] = bool(
        half >= 1.1 and lease["candidate"]["all"]["mape"] <= lease["status_quo"]["all"]["mape"]
        - 2.0)
    results["part_2"] = ("price the Hopper sets with and without `--model "
                         f"{candidate}` (the module docstring)")
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
