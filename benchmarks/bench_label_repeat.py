"""How well whole-model labels repeat on one device: the core set measured in several passes
(each a separate `mdot profile --core-set --out DIR`, alone on the machine), compared pass
against pass, and two passes combined (the smaller; the geometric mean) against two others:

    python benchmarks/bench_label_repeat.py data/cpu-amd-epyc-f25m17-2t \
        data/cpu-amd-epyc-f25m17-2t/core-set-passes/{2,3,4,5} \
        --out benchmarks/results/label-repeat-cpu-amd-epyc-f25m17-2t

The first folder is the device's dataset (its core-set keys only are read). With `--results`
(a leave-family-out folder of that dataset) it also scores the held-out predictions of
`--method` (`a+b` for a geometric mean, as `mdot evaluate --ensembles`) against every pass and
combination, each after dividing out the median ratio (the day's speed). Writes
`results.json` and prints the tables; nothing is measured here.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np
from family_errors import load_runs, run_name  # this folder (run as a script)

from mdot_jax.data import core_set
from mdot_jax.data.dataset import read_samples


def labels(folder: str, keys: set[str] | None = None) -> dict[str, float]:
    """key -> label_ms of the clean samples of `folder` (among `keys`)."""
    return {d["key"]: float(d["label_ms"])
            for d in read_samples(Path(folder) / "samples.jsonl")[0]
            if keys is None or d["key"] in keys}


def agreement(a: dict[str, float], b: dict[str, float]) -> dict:
    """How far `a` is from `b` on their common keys: the median ratio, and after dividing it
    out (a common speed change of the machine) the mean absolute percentage difference and the
    share within 10%."""
    keys = sorted(a.keys() & b.keys())
    r = np.array([a[k] / b[k] for k in keys])
    rel = r / np.median(r)
    return dict(n=len(keys), median_ratio=round(float(np.median(r)), 3),
                mape=round(float(100 * np.mean(np.abs(rel - 1))), 2),
                within_10=round(float(100 * np.mean(np.abs(rel - 1) <= 0.1)), 1),
                log_sd=round(float(np.std(np.log(r))), 3))


COMBINE = {"min": min, "mean": lambda x, y: float(np.sqrt(x * y))}  # of two passes' labels


def combined(how: str, a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: COMBINE[how](a[k], b[k]) for k in a.keys() & b.keys()}


def heldout_error(results: str, method: str, targets: dict[str, dict[str, float]],
                  dataset: str) -> dict[str, float]:
    """target name -> MAPE % of `method`'s held-out predictions (trained on the dataset's
    labels) against it, mean over the seeds, after dividing out the median ratio."""
    runs = [r for r in load_runs(results, labels(dataset), [method])
            if r["method"] == run_name(method)]
    by_seed: dict[int, dict[str, float]] = {}
    for r in runs:
        by_seed.setdefault(r["seed"], {}).update(zip(r["test_keys"], r["pred_ms"]))
    return {name: round(float(np.mean([agreement(pred, t)["mape"] for pred in by_seed.values()])),
                        2) for name, t in targets.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dataset", help="the device's dataset (pass 1: its core-set keys)")
    p.add_argument("passes", nargs="+", help="folders of further core-set passes")
    p.add_argument("--out", required=True)
    p.add_argument("--results", help="a leave-family-out results folder of the dataset")
    p.add_argument("--method", default="mdot-pe-none+lightgbm+op-sum")
    args = p.parse_args()
    keys = set(core_set.load()["core_set"])
    passes = [labels(f, keys) for f in [args.dataset, *args.passes]]
    names = [str(i + 1) for i in range(len(passes))]
    rows, targets = [], {name: d for name, d in zip(names, passes)}
    for i, j in itertools.combinations(range(len(passes)), 2):
        rows.append(dict(a=names[j], b=names[i], kind="one pass",
                         **agreement(passes[j], passes[i])))
    later = list(range(1, len(passes)))  # two passes against two others, after the first
    for how in COMBINE:
        for (i, j), (k, m) in itertools.combinations(itertools.combinations(later, 2), 2):
            if {i, j} & {k, m}:
                continue
            rows.append(dict(a=f"{how}({names[k]},{names[m]})",
                             b=f"{how}({names[i]},{names[j]})", kind=f"{how} of two",
                             **agreement(combined(how, passes[k], passes[m]),
                                         combined(how, passes[i], passes[j]))))
    for how in COMBINE:
        targets.update({f"{how}({names[i]},{names[j]})": combined(how, passes[i], passes[j])
                        for i, j in itertools.combinations(later, 2)})
    common = set.intersection(*(set(passes[i]) for i in later))
    targets[f"median({','.join(names[1:])})"] = {
        k: float(np.median([passes[i][k] for i in later])) for k in common}
    heldout = heldout_error(args.results, args.method, targets, args.dataset) if args.results \
        else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(dict(
        command="python benchmarks/bench_label_repeat.py " + " ".join(
            [args.dataset, *args.passes, "--out", args.out]
            + (["--results", args.results, "--method", args.method] if args.results else [])),
        passes=[args.dataset, *args.passes], rows=rows,
        heldout=heldout and dict(results=args.results, method=args.method, mape=heldout)),
        indent=1) + "\n")
    print("| a | b | kind | samples | median a / b | MAPE after the ratio % | within 10 % "
          "| log sd |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['a']} | {r['b']} | {r['kind']} | {r['n']} | {r['median_ratio']:.3f} | "
              f"{r['mape']:.1f} | {r['within_10']:.0f} | {r['log_sd']:.3f} |")
    if heldout:
        print(f"\n`{args.method}` held out, against | MAPE after the ratio %\n|---|---|")
        for name, e in heldout.items():
            print(f"| {name} | {e:.1f} |")


if __name__ == "__main__":
    main()
