"""The Megatron host blended with the GPU: chosen on vTrain's calibration rows, scored once.

    python benchmarks/bench_host_blend.py --vtrain ../shared/datasets/vtrain \
        --out benchmarks/results/host-blend [--ship]

The question, the mechanism and the rule (written before any row was priced with a blend):
docs/studies/host-blend.md. In short: (h, p) of least MAPE over the 360 calibration rows,
h from `bench_machine_host.MEGATRON_GRID`, p from `P_GRID` or none (today's pricing, whose
grid is benchmarks/results/megatron-host); then every row priced once with the choice and the
plan search re-run on those predictions; adopted only if the study's three conditions hold.
Resumable by stage from `--out`/results.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_machine_host import CALIBRATION, MEGATRON_GRID, checkpoint, mape, vtrain  # noqa: E402
from bench_megatron_host import COMMITTED, summary  # noqa: E402
from bench_vtrain import _rows  # noqa: E402

P_GRID = (2.0, 3.0, 4.0, 6.0, 8.0, 12.0)
TODAY = Path(__file__).parent / "results" / "megatron-host" / "results.json"
# the rule's bars (docs/studies/host-blend.md)
HELD_OUT_MAPE, MULTI_MAPE, HIT_RATE, P90_REGRET = 8.23, 8.25, 0.5196, 0.2517
AT_ONCE = 2  # bench processes side by side (this machine's cores)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vtrain", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ship", action="store_true", help="write the choice into the shipped "
                    "step model's meta if the rule adopts it")
    ap.add_argument("--work", type=Path, default=Path("/tmp/host-blend"))
    args = ap.parse_args(argv)
    from mdot_jax.gpu.gpu_ops import StepModel
    from mdot_jax.gpu.spec_sheet import STEP_MODEL_DIR

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "results.json"
    r = json.loads(path.read_text()) if path.exists() else {}

    def save():
        path.write_text(json.dumps(r, indent=1) + "\n")

    rows = {x["key"]: x for x in _rows(args.vtrain)}
    measured = {k: x["ms"] for k, x in rows.items()}
    r.setdefault("before", summary({d["key"]: d["predicted_ms"] / measured[d["key"]] for d in
                                    map(json.loads, COMMITTED.read_text().splitlines())}, rows))
    grid = r.setdefault("grid", {f"{us}/none": v for us, v in
                                 json.loads(TODAY.read_text())["grid"].items()})
    meta = json.loads((STEP_MODEL_DIR / StepModel.META).read_text())
    hosts = meta["host_ms_per_kernel"]
    calibration = [f"{hd}:{ly}" for hd, ly in sorted(CALIBRATION)]
    todo = [(h, p) for h in MEGATRON_GRID for p in P_GRID if f"{1e3 * h:.1f}/{p:g}" not in grid]
    for i in range(0, len(todo), AT_ONCE):  # 1. the calibration rows at every (h, p)
        jobs = {f"{1e3 * h:.1f}/{p:g}": (
            checkpoint(STEP_MODEL_DIR, args.work / f"{1e3 * h:.1f}us-{p:g}",
                       host_ms_per_kernel=dict(hosts, megatron=h),
                       host_blend={"megatron": p}),
            args.work / f"vtrain-{1e3 * h:.1f}us-{p:g}") for h, p in todo[i:i + AT_ONCE]}
        for name, v in vtrain(args.vtrain, jobs, "single", calibration).items():
            grid[name] = mape(v.values())
            print(f"{name}: {grid[name]:.2f}%", file=sys.stderr, flush=True)
        save()
    best = min(grid, key=grid.__getitem__)
    us, p = best.split("/")
    r["choice"] = dict(host_ms=round(float(us) / 1e3, 7), blend=None if p == "none" else
                       float(p), calibration_mape=grid[best])
    print(f"chosen: {us} us, p {p}: {grid[best]:.2f}% over the calibration rows",
          file=sys.stderr)
    blend = {"megatron": r["choice"]["blend"]} if r["choice"]["blend"] else {}
    scored = args.work / "chosen-scored"
    if "after" not in r:  # 2. every row once with the choice
        ckpt = checkpoint(STEP_MODEL_DIR, args.work / "chosen",
                          host_ms_per_kernel=dict(hosts, megatron=r["choice"]["host_ms"]),
                          host_blend=blend)
        ratios: dict = {}
        for scope in ("single", "multi"):
            ratios |= vtrain(args.vtrain, {"chosen": (ckpt, scored / scope)}, scope)["chosen"]
        r["after"] = summary(ratios, rows)
        save()
    if "plan" not in r:  # ... and the plan search on those predictions
        both = args.work / "chosen-predictions.jsonl"
        both.write_text("".join((scored / s / "predictions.jsonl").read_text()
                                for s in ("single", "multi")))
        subprocess.run([sys.executable, str(Path(__file__).with_name("bench_plan_choice.py")),
                        str(args.vtrain), "--predictions", str(both), "--out",
                        str(args.work / "plan")], check=True, stdout=subprocess.DEVNULL)
        r["plan"] = json.loads((args.work / "plan" / "results.json").read_text())[
            "summary"]["single/held-out"]
        save()
    a, plan = r["after"], r["plan"]
    r["adopted"] = bool(a["held_out"]["mape"] <= HELD_OUT_MAPE
                        and a["multi"]["mape"] <= MULTI_MAPE
                        and plan["hit_rate"] >= HIT_RATE and plan["p90_regret"] <= P90_REGRET)
    save()
    for part in a:
        b = r["before"][part]
        print(f"{part:<14} {a[part]['rows']:>5} rows  MAPE {b['mape']:5.1f}% -> "
              f"{a[part]['mape']:5.1f}%  median ratio {b['median_ratio']:.2f} -> "
              f"{a[part]['median_ratio']:.2f}")
    print(f"plan search, held-out groups: hit rate {plan['hit_rate']:.0%}, p90 regret "
          f"{plan['p90_regret']:.0%}; adopted: {r['adopted']}")
    if args.ship and r["adopted"]:
        meta["host_ms_per_kernel"] = dict(hosts, megatron=r["choice"]["host_ms"])
        meta["host_blend"] = blend
        meta["host_source"] += (", the Megatron host and its blend chosen again by "
                                "benchmarks/bench_host_blend.py")
        (STEP_MODEL_DIR / StepModel.META).write_text(json.dumps(meta, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
