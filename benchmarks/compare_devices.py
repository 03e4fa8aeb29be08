"""How two measured devices differ: the ratio of their labels on the samples both measured.

    python benchmarks/compare_devices.py data/cpu-amd-epyc-f25m17-2t data/cpu-amd-epyc-f26m2-2t

Prints the ratio's spread over every common (model, size, batch) key and by family, so one
can see whether one scale factor would carry a checkpoint from one device to the other
(`mdot adapt` fits one, or a line in log time). Two passes of one device compare the same
way (`mdot profile --core-set --out data/<device>/again`): how well its labels repeat.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np

from mdot_jax.data.dataset import load_dataset


def ratios(a_dir: str, b_dir: str) -> dict[str, float]:
    """key -> label on `a` / label on `b`, for the keys both measured."""
    a = {s.key: s.label_ms for s in load_dataset(a_dir).samples}
    b = {s.key: s.label_ms for s in load_dataset(b_dir).samples}
    return {k: a[k] / b[k] for k in sorted(a.keys() & b.keys())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("a")
    p.add_argument("b")
    args = p.parse_args()
    r = ratios(args.a, args.b)
    if not r:
        raise SystemExit("no common samples")
    v = np.array(list(r.values()))
    q = np.percentile(v, [10, 50, 90])
    log_sd = float(np.std(np.log(v)))
    print(f"{len(v)} common samples: {args.a} / {args.b} = {q[1]:.2f} (median), "
          f"p10-p90 {q[0]:.2f}-{q[2]:.2f}, min {v.min():.2f}, max {v.max():.2f}; "
          f"one scale factor leaves {100 * np.mean(np.abs(v / q[1] - 1)):.1f}% MAPE "
          f"(log sd {log_sd:.3f}); within 10%: {100 * np.mean(np.abs(v - 1) <= 0.1):.0f}% "
          f"({100 * np.mean(np.abs(v / q[1] - 1) <= 0.1):.0f}% after the factor)")
    by_family = defaultdict(list)
    for s in load_dataset(args.a).samples:
        if s.key in r:
            by_family[s.family].append(r[s.key])
    rows = sorted(((float(np.median(x)), f, len(x)) for f, x in by_family.items()))
    print("| family | samples | median ratio |\n|---|---|---|")
    for med, f, n in rows[:8] + [(None, "...", None)] + rows[-8:]:
        print(f"| {f} | {n or ''} | {'' if med is None else f'{med:.2f}'} |")


if __name__ == "__main__":
    main()
