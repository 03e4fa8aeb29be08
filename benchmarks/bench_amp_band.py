"""An 80% band for AMP steps on the GPUs whose tensor cores were measured: adopted or not.

    python benchmarks/bench_amp_band.py --out benchmarks/results/amp-band [--ship]

Why: the tensor-core issue asks that AMP and TF32 predictions carry a band where measured
tensor-core data backs them. At AMP the spec sheet prices GEMMs at the share of the peak XLA's
measured H100 GEMMs reach and fused attention as the H200's measured SDPA flash kernels; both
are Hopper's. Convolutions at AMP are measured nowhere yet, nor is any whole step at TF32. So
the band is for amp-* steps on Hopper GPUs without convolutions, operators priced as copies for
want of measurements, or unknown operators: `spec_sheet.price`'s gating of `amp_band` (in the
step model's meta: `band`, log(measured / predicted) at the 10th and 90th percentiles, and
`architectures`).

The rule, written before any step is priced for it:
1. Steps: every amp-bf16 whole step the kit measured on a lease machine
   (`bench_machine_host.LEASES`: the H200 lease; H100 lease 1; H100 lease 2 with its confirming
   machine, one lease) that the gating bands (found by pricing with a zero band), priced by the
   shipped step model at its own precision, SGD as measured. The PyTorch host was fitted on
   these machines' launch-bound core-set steps pooled (said with the result).
2. Leave one machine out: the band (10th and 90th percentiles of log(measured / predicted))
   from the other two machines' steps, its coverage (the share of the held-out machine's steps
   whose measured time lies inside) on the held-out machine.
3. Shipped (`--ship`: the band from all three machines' steps, `architectures` ["hopper"]) if
   the mean coverage over the three held-out machines lies in 70-90% and no machine's is below
   50%. Otherwise no band, and the result reported.
No seeds: two percentiles are all that is fitted.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_machine_host import LEASES, checkpoint  # noqa: E402

PRECISION = "amp-bf16"


def residuals(data: Path, work: Path) -> dict[str, list[float]]:
    """{machine: log(measured / predicted) of its banded amp-bf16 steps}."""
    from mdot_jax.data.dataset import load_dataset
    from mdot_jax.gpu import catalog
    from mdot_jax.gpu.gpu_ops import StepModel
    from mdot_jax.gpu.spec_sheet import STEP_MODEL_DIR, price

    zero = StepModel.load(checkpoint(STEP_MODEL_DIR, work / "zero-band", amp_band=dict(
        band=[0.0, 0.0], architectures=["hopper"])))
    out: dict[str, list[float]] = {}
    for machine, (sets, device) in LEASES.items():
        gpu = catalog.find(device)
        for d in sets:
            for s in load_dataset(str(data / d)).samples:
                if s.workload.precision != PRECISION:
                    continue
                p = price(s.seq, gpu, zero, precision=PRECISION, step="train",
                          optimizer="sgd", fit=False)
                if p.interval_ms is not None:
                    out.setdefault(machine, []).append(float(np.log(s.label_ms / p.iteration_ms)))
    return out


def band(values) -> list[float]:
    return [float(np.percentile(values, 10)), float(np.percentile(values, 90))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path("data/derived"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ship", action="store_true", help="if adopted, write the band into the "
                    "shipped step model's meta")
    ap.add_argument("--work", type=Path, default=Path("/tmp/amp-band"))
    args = ap.parse_args(argv)
    from mdot_jax.gpu.gpu_ops import StepModel
    from mdot_jax.gpu.spec_sheet import STEP_MODEL_DIR

    res = residuals(args.data, args.work)
    shutil.rmtree(args.work, ignore_errors=True)
    folds = {}
    for held, values in res.items():
        rest = [v for m, vs in res.items() if m != held for v in vs]
        lo, hi = band(rest)
        v = np.asarray(values)
        folds[held] = dict(steps=len(values), band=[lo, hi],
                           coverage=float(np.mean((v >= lo) & (v <= hi))),
                           median_ratio=float(np.exp(-np.median(v))))  # predicted / measured
    mean = float(np.mean([f["coverage"] for f in folds.values()]))
    adopted = 0.7 <= mean <= 0.9 and min(f["coverage"] for f in folds.values()) >= 0.5
    everything = band([v for vs in res.values() for v in vs])
    r = dict(precision=PRECISION, folds=folds, mean_coverage=mean, adopted=adopted,
             band_all=everything, band_all_ratio=[float(np.exp(x)) for x in everything])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(r, indent=1) + "\n")
    for m, f in folds.items():
        print(f"{m:<14} {f['steps']:>4} steps  band x{np.exp(f['band'][0]):.2f}-"
              f"x{np.exp(f['band'][1]):.2f}  coverage {f['coverage']:.0%}  median predicted / "
              f"measured {f['median_ratio']:.2f}")
    print(f"mean coverage {mean:.0%}: {'adopted' if adopted else 'not adopted'}; all machines' "
          f"band x{r['band_all_ratio'][0]:.2f}-x{r['band_all_ratio'][1]:.2f}")
    if args.ship and adopted:
        path = STEP_MODEL_DIR / StepModel.META
        meta = json.loads(path.read_text())
        meta["amp_band"] = dict(band=everything, architectures=["hopper"], source=(
            "10th-90th percentile of log(measured / predicted) of the amp-bf16 kit steps "
            "without convolutions of three lease machines (two H100, one H200), "
            "benchmarks/bench_amp_band.py"))
        path.write_text(json.dumps(meta, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
