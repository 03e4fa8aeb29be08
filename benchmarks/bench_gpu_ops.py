"""The GPU operator model on GPUs it never saw: NeuSight's public fp32 operator measurements.

    python benchmarks/bench_gpu_ops.py ../shared/datasets/neusight \
        --out benchmarks/results/gpu-ops-neusight

The rule (written before the run on the unseen GPUs):
1. Fitted only on the training collections of NeuSight's five training GPUs (P4, P100, T4,
   V100, A100 40 GB PCIe). H100, L4 and A100 80 GB PCIe are the unseen GPUs: nothing of them
   is fitted, tuned or chosen on; they are described by the catalog's spec sheet alone.
2. The feature set (`relative`, or `relative` plus the device's own numbers, `absolute`) is
   chosen by leave-one-GPU-out over the five training GPUs (mean over GPUs of the MAPE of
   all their rows), before the unseen GPUs are scored.
3. The chosen model, fitted on all five, is scored once on the unseen GPUs' test rows (bmm,
   linear, elementwise, softmax, layer norm), per GPU and op class, against the plain roofline
   and a calibrated roofline (per op class: roofline / efficiency + overhead, fitted on the
   same rows). It is adopted as the GPU operator model if its mean MAPE over the three unseen
   GPUs is below the calibrated roofline's.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from mdot_jax.data import gpus, neusight
from mdot_jax.models.gpu_ops import CalibratedRoofline, GpuOpModel, roofline_ms


def _columns(rows):
    return ([r.op for r in rows], [r.dims for r in rows], [gpus.find(r.gpu) for r in rows],
            np.asarray([r.ms for r in rows]))


def ape(pred, ms) -> np.ndarray:
    return 100 * np.abs(np.asarray(pred) / ms - 1)


def table(rows, preds: dict[str, np.ndarray]) -> dict:
    """Per GPU and op class (and all): rows, then MAPE / median APE of every predictor."""
    out: dict = defaultdict(dict)
    ms = np.asarray([r.ms for r in rows])
    keys = [(r.gpu, CalibratedRoofline.op_class(r.op)) for r in rows]
    for gpu in sorted({k[0] for k in keys}):
        for cls in ["(all)", *sorted({k[1] for k in keys if k[0] == gpu})]:
            m = np.asarray([k[0] == gpu and (cls == "(all)" or k[1] == cls) for k in keys])
            out[gpu][cls] = dict(n=int(m.sum()), **{
                name: dict(mape=float(ape(p[m], ms[m]).mean()),
                           median_ape=float(np.median(ape(p[m], ms[m]))))
                for name, p in preds.items()})
    return dict(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("neusight", help="NeuSight's folder (../shared/datasets/neusight)")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rows = neusight.read(args.neusight)
    seen = neusight.training_gpus(rows)
    train = [r for r in rows if r.split == "train"]
    unseen = [r for r in rows if r.split == "test" and r.gpu not in seen]
    assert not {r.gpu for r in unseen} & {r.gpu for r in train}
    print(f"{len(train)} training rows of {seen}; {len(unseen)} test rows of "
          f"{sorted({r.gpu for r in unseen})}", flush=True)

    logo: dict[str, dict[str, float]] = {}
    for name, absolute in (("relative", False), ("absolute", True)):
        logo[name] = {}
        for held in seen:
            fit = [r for r in train if r.gpu != held]
            test = [r for r in train if r.gpu == held]
            model = GpuOpModel.fit(*_columns(fit), absolute=absolute, seed=args.seed)
            o, d, g, ms = _columns(test)
            logo[name][held] = float(ape(model.predict(o, d, g), ms).mean())
            print(f"leave-one-GPU-out {name:<8} {held:<24} MAPE {logo[name][held]:6.2f}%",
                  flush=True)
    chosen = min(logo, key=lambda k: np.mean(list(logo[k].values())))

    model = GpuOpModel.fit(*_columns(train), absolute=chosen == "absolute", seed=args.seed)
    calibrated = CalibratedRoofline.fit(*_columns(train))
    o, d, g, ms = _columns(unseen)
    preds = {"model": model.predict(o, d, g), "roofline": np.asarray(
        [roofline_ms(*x) for x in zip(o, d, g)]), "calibrated roofline": calibrated.predict(
        o, d, g)}
    result = table(unseen, preds)
    mean = {k: float(np.mean([result[gpu]["(all)"][k]["mape"] for gpu in result]))
            for k in preds}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(dict(
        command="python benchmarks/bench_gpu_ops.py " + " ".join(
            [args.neusight, "--out", args.out]), training_gpus=seen,
        leave_one_gpu_out_mape=logo, chosen=chosen, unseen=result, mean_unseen_mape=mean,
        adopted=mean["model"] < mean["calibrated roofline"]), indent=1))
    lines = ["| GPU | ops | rows | model MAPE (median) | roofline | calibrated roofline |",
             "|---|---|---|---|---|---|"]
    for gpu, by in result.items():
        for cls, r in by.items():
            cell = [f"{r[k]['mape']:.1f}% ({r[k]['median_ape']:.1f}%)" for k in preds]
            lines.append(f"| {gpu} | {cls} | {r['n']} | " + " | ".join(cell) + " |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"feature set chosen by leave-one-GPU-out: {chosen} "
          f"({ {k: round(float(np.mean(list(v.values()))), 2) for k, v in logo.items()} })")
    print(f"mean MAPE over the unseen GPUs: {mean}")


if __name__ == "__main__":
    main()
