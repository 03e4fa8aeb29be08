"""Each lease machine's own PyTorch host: the range a launch-bound prediction says.

    python benchmarks/bench_host_range.py --out benchmarks/results/host-range [--ship]

The shipped host (`host_ms_per_kernel["pytorch"]`) is fitted on the launch-bound steps (64 px /
32 tokens) of the three lease machines pooled (`bench_machine_host.py`); each machine alone
issues kernels at its own pace (docs/studies/hopper-held-out.md: a host fitted on one GPU's
machines costs 12-19 points on the other's launch-bound steps). Here each machine's host is
fitted alone, the same way (`gpu_fit.best_host`, the shipped step model); `--ship` writes the
least and the most into the shipped meta (`host_range_ms_per_kernel`), which a launch-bound
prediction states as the step's time on the slowest and the fastest machine measured. Nothing
is tuned: a grid search per machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_machine_host import LEASES, core_kernels  # noqa: E402


def machine_hosts(data: Path) -> dict[str, list[float]]:
    """{machine: (its host's ms a kernel, MAPE %, MAPE at the grid's fastest)}."""
    from mdot_jax.gpu import gpu_fit
    from mdot_jax.gpu.spec_sheet import load_step_model

    model = load_step_model()
    return {m: list(gpu_fit.best_host(core_kernels(model, m, data))) for m in LEASES}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path("data/derived"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ship", action="store_true", help="write the range into the shipped "
                    "step model's meta")
    args = ap.parse_args(argv)
    from mdot_jax.storage.checkpoint import amend_step_model
    from mdot_jax.storage.shipped import STEP_MODEL_DIR

    hosts = machine_hosts(args.data)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(dict(pytorch=hosts), indent=1) + "\n")
    for m, (h, mape, _) in hosts.items():
        print(f"{m:<14} {1e3 * h:5.1f} us a kernel (MAPE {mape:.1f}%)")
    if args.ship:
        ms = [h for h, *_ in hosts.values()]
        amend_step_model(STEP_MODEL_DIR, lambda meta: meta.update(
            host_range_ms_per_kernel=dict(pytorch=[min(ms), max(ms)]),
            host_range_source="pytorch: gpu_fit.best_host over each lease machine's "
            "launch-bound steps alone (" + ", ".join(
                f"{m} {1e3 * h:.1f} us" for m, (h, *_) in hosts.items())
            + "), benchmarks/bench_host_range.py --ship"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
