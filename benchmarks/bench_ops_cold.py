"""Do operators run slower in a network than in isolation because their data is no longer in
cache? A seeded sample of a device's measured operators, each timed call by call, forward and
backward, alternately warm (called again at once, as the profiler's inner loop does) and cold,
alone on the machine. Two ways of cold:
- `flush`: a 64 MiB buffer written before the call: everything leaves the caches, the
  operator's data and the framework's own code and bookkeeping alike;
- `rotate`: the operator built again on other data until the copies hold 64 MiB (at most
  512 copies), the cold calls taking turns over them: only the data is cold.

    python benchmarks/bench_ops_cold.py data/cpu-amd-epyc-f25m17-2t/ops --n 300 \
        --out benchmarks/results/ops-cold-cpu-amd-epyc-f25m17-2t [--mode rotate]

Writes `results.jsonl` (`results-rotate.jsonl`; one line per operator, appended: resumable)
and prints cold / warm by kind and by the size of the operator's data. Nothing in the
operator folder changes.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from mdot_jax.ops.profile import read_op_samples
from mdot_jax.ops.specs import OpSpec, Unsupported, build

FLUSH_BYTES = 64 << 20  # more than the last-level cache of the CPUs measured here
MAX_COPIES = 512


def per_call(cases, torch, calls: int, flush) -> tuple[list[float], list[float]]:
    """`calls` forward + backward times (ms) each warm (`cases[0]` again) and cold (after
    `flush()`, on the next of `cases` in turn), interleaved."""
    out = cases[0].forward()
    outs = [o for o in (out if isinstance(out, (tuple, list)) else [out])
            if getattr(o, "requires_grad", False)]
    grads = [torch.randn_like(o) for o in outs]

    def call(case) -> float:
        for t in case.leaves:
            t.grad = None
        t0 = time.perf_counter()
        o = case.forward()
        if grads:
            torch.autograd.backward([x for x in (o if isinstance(o, (tuple, list)) else [o])
                                     if getattr(x, "requires_grad", False)], grads)
        return (time.perf_counter() - t0) * 1e3

    for c in cases:
        call(c)
    call(cases[0])
    warm, cold = [], []
    for i in range(calls):
        warm.append(call(cases[0]))
        flush()
        cold.append(call(cases[1 + i % (len(cases) - 1)] if len(cases) > 1 else cases[0]))
    return warm, cold


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("ops")
    p.add_argument("--n", type=int, default=300)
    p.add_argument("--calls", type=int, default=9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    p.add_argument("--mode", choices=("flush", "rotate"), default="flush")
    args = p.parse_args()
    import torch
    from tqdm import tqdm

    torch.set_num_threads(2)
    rows = [d for d in read_op_samples(args.ops) if 0.05 <= d["label_ms"] <= 50]
    pick = np.random.default_rng(args.seed).choice(len(rows), min(args.n, len(rows)),
                                                   replace=False)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / ("results.jsonl" if args.mode == "flush" else "results-rotate.jsonl")
    done = {json.loads(line)["key"] for line in path.read_text().splitlines()} \
        if path.exists() else set()
    buf = torch.empty(FLUSH_BYTES // 4) if args.mode == "flush" else None

    def flush():
        if args.mode == "flush":
            buf.add_(1.0)

    with open(path, "a", encoding="utf-8") as f:
        for i in tqdm(pick, desc="warm / cold", unit="op"):
            d = rows[i]
            if d["key"] in done:
                continue
            spec = OpSpec.from_json(d["spec"])
            size = spec.ld["bytes_read"] + spec.ld["bytes_written"]
            copies = 1 if args.mode == "flush" else 1 + int(min(
                MAX_COPIES, max(1, -(-FLUSH_BYTES // max(size, 1)))))
            try:
                cases = [build(spec, torch, seed=i) for i in range(copies)]
                warm, cold = per_call(cases, torch, args.calls, flush)
            except (Unsupported, RuntimeError):
                continue
            ld = spec.ld
            f.write(json.dumps(dict(key=d["key"], kind=spec.kind, label_ms=d["label_ms"],
                                    bytes=ld["bytes_read"] + ld["bytes_written"],
                                    warm_ms=float(np.median(warm)),
                                    cold_ms=float(np.median(cold)))) + "\n")
            f.flush()
    res = [json.loads(line) for line in path.read_text().splitlines()]
    ratio = np.array([r["cold_ms"] / r["warm_ms"] for r in res])
    print(f"{len(res)} operators: cold / warm median {np.median(ratio):.2f} "
          f"(p10 {np.percentile(ratio, 10):.2f}, p90 {np.percentile(ratio, 90):.2f})")
    by = defaultdict(list)
    for r, q in zip(res, ratio):
        by[r["kind"]].append(q)
    print("| kind | operators | cold / warm median |\n|---|---|---|")
    for k, v in sorted(by.items(), key=lambda kv: -len(kv[1])):
        if len(v) >= 5:
            print(f"| {k} | {len(v)} | {np.median(v):.2f} |")
    edges = [0, 2**18, 2**20, 2**22, 2**24, 2**40]  # bytes read + written
    size = np.array([r["bytes"] for r in res])
    print("| data read + written | operators | cold / warm median |\n|---|---|---|")
    for lo, hi in zip(edges, edges[1:]):
        sel = (size >= lo) & (size < hi)
        if sel.any():
            span = f"{lo / 2**20:g}-{hi / 2**20:g}" if hi < edges[-1] else f"{lo / 2**20:g}+"
            print(f"| {span} MiB | {int(sel.sum())} | {np.median(ratio[sel]):.2f} |")


if __name__ == "__main__":
    main()
