"""Binary kernels with a broadcast operand: the premise of the pre-registered study
(docs/studies/broadcast-operands.md), decided on a lease's kernel sweep.

    python benchmarks/bench_broadcast.py --sweep data/<gpu slug>/kernels.jsonl.xz --out DIR

Per precision, the median share of the bandwidth the broadcast kinds (`add-bcast`, `mul-bcast`)
reach (bytes the kernel must move over its time, over the GPU's bandwidth) against their
contiguous twins' (`add`, `mul` rows that move more than `LARGE` bytes); the premise holds where
every precision's ratio is at most `PREMISE`. Writes OUT/results.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

LARGE = 64 * 2 ** 20  # bytes: a contiguous row this large streams at the GPU's bandwidth
PREMISE = 0.6  # the broadcast kinds' share over their twins', at most, for the premise to hold
TWIN = {"add-bcast": "add", "mul-bcast": "mul"}


def shares(rows: list[dict]) -> dict:
    """Per precision: the median share of the bandwidth of the broadcast rows and of their
    contiguous twins, their ratio, and how many rows of each."""
    from mdot_jax.gpu import catalog

    out: dict = {}
    for p in sorted({r["precision"] for r in rows if r["kind"] in TWIN}):
        got = {}
        for side, kinds in (("broadcast", set(TWIN)), ("contiguous", set(TWIN.values()))):
            ok = [r for r in rows if r["kind"] in kinds and r["precision"] == p and r.get("ms")
                  and (side == "broadcast" or r["bytes"] > LARGE)]
            got[side] = [r["bytes"] / (r["ms"] * 1e-3) / (catalog.find(r["device"]).memory_gbs
                                                          * 1e9) for r in ok]
        if all(got.values()):
            b, c = (statistics.median(got[k]) for k in ("broadcast", "contiguous"))
            out[p] = dict(broadcast=b, contiguous=c, ratio=b / c, rows=len(got["broadcast"]),
                          twins=len(got["contiguous"]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", required=True, help="a lease's kernels.jsonl (or packed)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    from mdot_jax.measure.kernel_sweep import read

    measured = shares(read(args.sweep))
    if not measured:
        raise SystemExit(f"{args.sweep}: no measured add-bcast or mul-bcast rows beside large "
                         "add or mul ones: the sweep is older than these kinds")
    result = dict(sweep=str(args.sweep), premise_at_most=PREMISE, by_precision=measured,
                  premise_holds=all(v["ratio"] <= PREMISE for v in measured.values()))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
