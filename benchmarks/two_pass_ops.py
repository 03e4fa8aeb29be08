"""An operator folder whose labels are the smaller of two passes (docs/operators.md section 10),
written as derived data for `--op-costs`:

    python benchmarks/two_pass_ops.py data/cpu-amd-epyc-f25m17-2t/ops --first-plan \
        --out data/derived/cpu-amd-epyc-f25m17-2t-ops-2pass

Writes `samples.jsonl` (`ops.profile.two_pass_samples`) and prints how far the second pass
moved the labels. Nothing in the source folder changes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from mdot_jax.ops.profile import read_plan, two_pass_samples
from mdot_jax.ops.specs import OpSpec


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("ops")
    p.add_argument("--out", required=True)
    p.add_argument("--first-plan", action="store_true",
                   help="only the rows of the first plan (none an `--ops-more` extension added)")
    args = p.parse_args()
    out = Path(args.out)
    if (out / "samples.jsonl").exists():
        raise SystemExit(f"{out}/samples.jsonl exists: give a new --out")
    rows = two_pass_samples(args.ops)
    if args.first_plan:
        extension = {OpSpec.from_json(d["spec"]).key for d in read_plan(Path(args.ops))
                     if d.get("extension")}
        rows = [d for d in rows if d["key"] not in extension]
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "samples.jsonl.tmp"
    tmp.write_text("".join(json.dumps(d, sort_keys=True) + "\n" for d in rows))
    tmp.replace(out / "samples.jsonl")
    ratio = np.array([d["passes_ms"][1] / d["passes_ms"][0] for d in rows if "passes_ms" in d])
    q = np.percentile(ratio, [10, 25, 50, 75, 90])
    print(f"{len(rows)} samples, {len(ratio)} with a clean second pass; second / first: "
          f"p10 {q[0]:.3f}, p25 {q[1]:.3f}, median {q[2]:.3f}, p75 {q[3]:.3f}, p90 {q[4]:.3f}; "
          f"within 10%: {100 * np.mean(np.abs(ratio - 1) <= 0.1):.0f}%; labels lowered: "
          f"{int(np.sum(ratio < 1))}")


if __name__ == "__main__":
    main()
