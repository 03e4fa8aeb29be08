"""An operator folder whose labels are the smaller of two passes (docs/operators.md section 10),
or with `--cold` the cold pass's (section 12), written as derived data for `--op-costs`:

    python benchmarks/two_pass_ops.py data/cpu-amd-epyc-f25m17-2t/ops --first-plan \
        --out data/derived/cpu-amd-epyc-f25m17-2t-ops-2pass

Writes `samples.jsonl` (`ops.profile.two_pass_samples`, or `cold_samples`: only the rows with
a clean cold measurement) and prints how far the other pass moved the labels. Nothing in the
source folder changes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from mdot_jax.ops.profile import cold_samples, read_plan, two_pass_samples
from mdot_jax.ops.specs import OpSpec


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("ops")
    p.add_argument("--out", required=True)
    p.add_argument("--first-plan", action="store_true",
                   help="only the rows of the first plan (none an `--ops-more` extension added)")
    p.add_argument("--cold", action="store_true", help="the cold pass's labels (cold.jsonl)")
    args = p.parse_args()
    out = Path(args.out)
    if (out / "samples.jsonl").exists():
        raise SystemExit(f"{out}/samples.jsonl exists: give a new --out")
    rows = cold_samples(args.ops) if args.cold else two_pass_samples(args.ops)
    if args.first_plan:
        extension = {OpSpec.from_json(d["spec"]).key for d in read_plan(Path(args.ops))
                     if d.get("extension")}
        rows = [d for d in rows if d["key"] not in extension]
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "samples.jsonl.tmp"
    tmp.write_text("".join(json.dumps(d, sort_keys=True) + "\n" for d in rows))
    tmp.replace(out / "samples.jsonl")
    if args.cold:
        ratio = np.array([d["label_ms"] / d["warm_ms"] for d in rows])
        what = f"{len(rows)} samples measured cold; cold / warm"
    else:
        ratio = np.array([d["passes_ms"][1] / d["passes_ms"][0] for d in rows
                          if "passes_ms" in d])
        what = f"{len(rows)} samples, {len(ratio)} with a clean second pass; second / first"
    q = np.percentile(ratio, [10, 25, 50, 75, 90])
    print(f"{what}: p10 {q[0]:.3f}, p25 {q[1]:.3f}, median {q[2]:.3f}, p75 {q[3]:.3f}, "
          f"p90 {q[4]:.3f}; within 10%: {100 * np.mean(np.abs(ratio - 1) <= 0.1):.0f}%; "
          f"labels lowered: {int(np.sum(ratio < 1))}")


if __name__ == "__main__":
    main()
