"""Adapting the spec-sheet step model to a GPU's measured steps: today's forms (`scale`,
`affine`) against the same choice with the `machine` form (the kernels' factor and the host),
by the rule of `docs/studies/machine-adaptation.md` (written before any set was scored):

    python benchmarks/bench_adapt_gpu.py --out benchmarks/results/machine-adaptation

Every measured GPU set with more than 10 steps; in each, five draws of 10 rows
(`default_rng(seed).choice(n, 10, replace=False)`, seeds 0-4), each adaptation fitted on the 10
and scored on the set's other rows; the mean over the draws of that MAPE and of the share of
held-out steps inside the 80% band. Adopted if lower on at least 6 of the 8 sets and higher on
none by more than 1 point. Each set's priced steps, kernels and all, are kept in `--work`
(resumable; megabytes, not committed).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

DERIVED = Path(__file__).resolve().parent.parent / "data" / "derived"
# name -> (the dataset under data/derived, the catalog's GPU, the layout kept or None)
SETS = {
    "h100-lease-1-amp-bf16": ("gpu-nvidia-h100-80gb-hbm3-amp-bf16-fused", "h100 sxm", None),
    "h100-lease-1-fp32": ("gpu-nvidia-h100-80gb-hbm3-fp32-fused", "h100 sxm", None),
    "h100-lease-2-amp-bf16": ("gpu-nvidia-h100-80gb-hbm3-lease-2-amp-bf16-fused", "h100 sxm",
                              None),
    "h100-lease-2-fp32": ("gpu-nvidia-h100-80gb-hbm3-lease-2-fp32-fused", "h100 sxm", None),
    "h200-amp-bf16": ("gpu-nvidia-h200-amp-bf16-fused", "h200 sxm", None),
    "h200-fp32": ("gpu-nvidia-h200-fp32-fused", "h200 sxm", None),
    "h200-core-amp-bf16": ("gpu-nvidia-h200-core-amp-bf16-fused", "h200 sxm", None),
    "rtx3090-timm-nchw": ("timm-rtx3090-fused", "rtx 3090", "nchw"),
}
DRAWS, FITTED = 5, 10


def priced(dataset: str, device: str, layout: str | None) -> list[dict]:
    """Each step of `dataset` priced by the shipped step model as the kit ran it (train, SGD),
    with its kernels in the order they run."""
    from mdot_jax.data.dataset import load_dataset
    from mdot_jax.gpu import catalog
    from mdot_jax.gpu.spec_sheet import load_step_model, price

    model, gpu, rows = load_step_model(), catalog.find(device), []
    for s in load_dataset(str(DERIVED / dataset)).samples:
        if layout and s.workload.layout != layout:
            continue
        ks: list[float] = []
        p = price(s.seq, gpu, model, precision=s.workload.precision, step="train",
                  optimizer="sgd", fit=False, kernels=ks, layout=s.workload.layout)
        rows.append(dict(model=s.arch, batch=s.workload.batch_size, measured_ms=s.label_ms,
                         predicted_ms=p.iteration_ms, kernels=ks))
    return rows


def scored(rows: list[dict], machine: bool, seed: int) -> tuple[float, float, str]:
    """(MAPE, share inside the band) on the rows not drawn, of the adaptation fitted on the
    `FITTED` rows `seed` draws; the form it chose."""
    from mdot_jax.serving.adaptation import adapted_ms, fit

    pick = np.random.default_rng(seed).choice(len(rows), FITTED, replace=False)
    taken = set(pick.tolist())
    drawn, rest = [rows[i] for i in pick], [r for i, r in enumerate(rows) if i not in taken]
    a = fit([r["predicted_ms"] for r in drawn], [r["measured_ms"] for r in drawn], "gpu",
            kernels=[r["kernels"] for r in drawn] if machine else None)
    pred = np.asarray([adapted_ms(a, r["predicted_ms"], r["kernels"]) for r in rest])
    m = np.asarray([r["measured_ms"] for r in rest])
    inside = (m >= pred * math.exp(a.lo)) & (m <= pred * math.exp(a.hi))
    return float(np.mean(np.abs(pred / m - 1)) * 100), float(inside.mean()), a.fit


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/mdot-adapt-gpu"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    result: dict = dict(command="python benchmarks/bench_adapt_gpu.py --out " + str(args.out),
                        sets={})
    forms = (("today", False), ("with machine", True))  # (name, machine offered)
    for name, (dataset, device, layout) in SETS.items():
        cache = args.work / f"priced-{name}.json"
        if not cache.exists():
            print(f"pricing {name}", file=sys.stderr)
            cache.write_text(json.dumps(priced(dataset, device, layout)))
        rows = json.loads(cache.read_text())
        if len(rows) <= FITTED:
            continue
        per = {}
        for form, machine in forms:
            runs = [scored(rows, machine, seed) for seed in range(DRAWS)]
            per[form] = dict(mape=float(np.mean([r[0] for r in runs])),
                             band_coverage=float(np.mean([r[1] for r in runs])),
                             forms=[r[2] for r in runs])
        per["steps"] = len(rows)
        result["sets"][name] = per
        print(f"{name:24s} {len(rows):4d} steps: " + ", ".join(
            f"{f} {per[f]['mape']:5.1f}% (band {per[f]['band_coverage']:.0%}) {per[f]['forms']}"
            for f, *_ in forms), file=sys.stderr)
    base, candidate = (f for f, *_ in forms)
    sets = result["sets"].values()
    lower = sum(s[candidate]["mape"] < s[base]["mape"] for s in sets)
    worse = max(s[candidate]["mape"] - s[base]["mape"] for s in sets)
    result.update(lower_on=lower, of=len(result["sets"]), most_worse_points=worse,
                  adopted=lower >= 6 and worse <= 1.0)
    (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    print({k: v for k, v in result.items() if k != "sets"}, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
