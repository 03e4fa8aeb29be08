"""`mdot adapt` on a device no checkpoint was trained on: k measured samples of k families, the
error on every other family of that device, before and after.

    python benchmarks/bench_adapt.py --target data/cpu-amd-epyc-f25m17-2t \\
        --sequences data/derived/cpu-amd-epyc-f26m2-2t-fused --base cpu-amd-epyc-f26m2-2t
    python benchmarks/bench_adapt.py --timing benchmarks/results/probe-time

With `--timing`: how long the probe and `mdot adapt --probe` take on this machine from nothing
(goals: <= 5 and <= 10 minutes on 2 cores).

The target's labels are its own measurements; the operator sequences come from `--sequences`
(a fused copy holding the same keys: the same model, size and batch is the same graph on any
device), as the shipped checkpoints read fused sequences. Each draw picks k families at random
(seeded), adapts on one sample of each, and scores every sample of the other families.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from mdot_jax.data.dataset import load_dataset
from mdot_jax.serving.adaptation import fit
from mdot_jax.serving.predict import Predictor

LIMITS_S = {"probe": 300, "adapt": 600}


def _timed(args: list[str]) -> tuple[float, list[str]]:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "mdot_jax.cli", *args], capture_output=True,
                          text=True)
    if done.returncode:
        said = (done.stdout + done.stderr).strip().splitlines()[-3:]
        raise SystemExit(f"mdot {' '.join(args)} failed (exit code {done.returncode}): "
                         + " / ".join(said))
    return time.perf_counter() - t0, done.stdout.strip().splitlines()[-3:]


def timing(out: str, threads: int) -> None:
    """How long `mdot probe` and `mdot adapt --probe` take from nothing, as a user runs them
    (fresh temporary folders: nothing reused); one line per run appended to
    `<out>/results.jsonl`. Run it with nothing else on the machine."""
    from mdot_jax.measure.device import device_slug, fingerprint

    slug = device_slug(fingerprint(threads))
    with tempfile.TemporaryDirectory() as tmp:
        probe_s, _ = _timed(["probe", "--out", f"{tmp}/probe", "--threads", str(threads)])
        adapt_s, said = _timed(["adapt", "--probe", "--data", f"{tmp}/adapt", "--out",
                                f"{tmp}/ck", "--threads", str(threads)])
    row = dict(date=datetime.date.today().isoformat(), device=slug, threads=threads,
               probe_s=round(probe_s, 1), adapt_s=round(adapt_s, 1), adapt_said=said,
               within_limits=probe_s <= LIMITS_S["probe"] and adapt_s <= LIMITS_S["adapt"])
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", help="the new device's dataset (labels)")
    p.add_argument("--sequences", help="a fused dataset with the same keys")
    p.add_argument("--base", help="checkpoint to adapt")
    p.add_argument("--timing", metavar="OUT", help="time the probe and adapt --probe instead")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--k", type=int, nargs="+", default=[5, 10, 20])
    p.add_argument("--draws", type=int, default=5)
    args = p.parse_args()
    if args.timing:
        return timing(args.timing, args.threads)
    if not (args.target and args.sequences and args.base):
        p.error("--target, --sequences and --base are required (or --timing OUT)")

    labels = {s.key: s for s in load_dataset(args.target).samples}
    samples = [s for s in load_dataset(args.sequences).samples if s.key in labels]
    predictor = Predictor.load(args.base)
    pred = np.array([p.iteration_ms for p in predictor.predict_many(  # as for its own device
        [(s.seq, dataclasses.replace(s.workload, device=predictor.devices[0]))
         for s in samples])])
    true = np.array([labels[s.key].label_ms for s in samples])
    family = np.array([s.family for s in samples])
    families = sorted(set(family))
    ape = lambda p, t: 100 * np.abs(p / t - 1)  # noqa: E731
    print(f"{len(samples)} samples of {len(families)} families on {args.target}, base "
          f"{args.base}: unadapted MAPE {ape(pred, true).mean():.1f}%")
    print("| k | fit chosen | adapted MAPE % | expected (leave-one-out) % | 80% band held % |")
    print("|---|---|---|---|---|")
    for k in args.k:
        rows = []
        for draw in range(args.draws):
            rng = np.random.default_rng(draw)
            chosen = rng.choice(families, k, replace=False)
            idx = [int(rng.choice(np.flatnonzero(family == f))) for f in chosen]
            test = ~np.isin(family, chosen)
            a = fit(pred[idx], true[idx], "target")
            adapted = a.apply(pred[test])
            lo, hi = adapted * np.exp(a.lo), adapted * np.exp(a.hi)
            held = np.mean((true[test] >= lo) & (true[test] <= hi)) * 100
            rows.append((a.fit, ape(adapted, true[test]).mean(), a.loo_mape, held))
        fits = ", ".join(sorted({r[0] for r in rows}))
        m = np.array([r[1:] for r in rows]).mean(axis=0)
        print(f"| {k} | {fits} | {m[0]:.1f} | {m[1]:.1f} | {m[2]:.0f} |")


if __name__ == "__main__":
    main()
