"""Kernel cost model accuracy on held-out operator configurations, per op type.

    python benchmarks/bench_kernels.py data/cpu-amd-epyc-f25m17-2t/ops \
        --models data/derived/cpu-amd-epyc-f25m17-2t-fused \
        --out benchmarks/results/kernels-cpu-amd-epyc-f25m17-2t

Two held-out splits, each fitted on the rest with the same settings (seed 0):
- `config`: a random 20% of the measured configurations (every key is a distinct row);
- `family`: the configurations drawn from a random 20% of the model families (the rows of
  families the cost model never saw a row of).
Per type: samples, median and p90 absolute percentage error, and the type's share of the
predicted time of the model dataset's graphs (the rows, as they occur, priced by a model fitted
on every sample), so that "the types that carry 90% of the time" is read off the table.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from converters.vocab import VOCAB
from mdot_jax.data.dataset import family_of, load_dataset
from mdot_jax.kernels.cost_model import CostModel
from mdot_jax.kernels.op_profile import read_op_samples, read_plan
from mdot_jax.kernels.specs import LOSS, OpSpec


def source_family(d: dict) -> str:
    return "loss" if d["source"] == "loss" else family_of(d["source"].split("/")[0])


def held_out(records: list[dict], test: np.ndarray, seed: int,
             fit_on: np.ndarray | None = None) -> dict[str, dict]:
    """Per op type, per kind (`Conv:depthwise`, `Gather:table`, ...) and over all: held-out
    samples, median and p90 APE of a model fitted on the rest (of `fit_on` if given)."""
    train = ~test if fit_on is None else fit_on & ~test
    model = CostModel.fit([d for d, t in zip(records, train) if t], seed=seed)
    recs = [d for d, t in zip(records, test) if t]
    specs = [OpSpec.from_json(d["spec"]) for d in recs]
    pred = model.predict(specs)
    ape = defaultdict(list)
    for d, spec, p in zip(recs, specs, pred):
        groups = [d["op_type"], "(all)"]
        if spec.kind != d["op_type"]:
            groups.append(spec.kind)
        for g in groups:
            ape[g].append(abs(p / d["label_ms"] - 1))
    return {t: dict(n=len(v), median_ape=100 * float(np.median(v)),
                    p90_ape=100 * float(np.percentile(v, 90))) for t, v in ape.items()}


def time_shares(model: CostModel, models_dir: str) -> dict[str, float]:
    """Op type -> share of the summed predicted time of every graph of the model dataset."""
    total: dict[str, float] = defaultdict(float)
    seen = set()
    for s in load_dataset(models_dir).samples:
        if s.seq_path in seen:
            continue
        seen.add(s.seq_path)
        ms = model.sequence_ms(s.seq)
        for t, m in zip(s.seq.op_type, ms):
            total[VOCAB[t]] += float(m)
        total[LOSS] += model.loss_ms(s.workload.batch_size, 2 if s.meta.get("kind") == "text"
                                     else 1000)
    z = sum(total.values())
    return {t: v / z for t, v in sorted(total.items(), key=lambda kv: -kv[1])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("ops")
    p.add_argument("--models", required=True, help="the model dataset of the same device")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--extension-gain", action="store_true",
                   help="also fit without the rows `--ops-more` added, both scored on the same "
                        "held-out rows of the first plan (what the extension bought)")
    args = p.parse_args()
    records = read_op_samples(args.ops)
    rng = np.random.default_rng(args.seed)
    by_config = rng.random(len(records)) < 0.2
    families = sorted({source_family(d) for d in records} - {"loss"})
    test_fams = set(rng.choice(families, size=max(1, len(families) // 5), replace=False))
    by_family = np.asarray([source_family(d) in test_fams for d in records])
    results = dict(
        samples=len(records), seed=args.seed, test_families=sorted(test_fams),
        config=held_out(records, by_config, args.seed),
        family=held_out(records, by_family, args.seed))
    if args.extension_gain:
        extension = {OpSpec.from_json(d["spec"]).key for d in read_plan(Path(args.ops))
                     if d.get("extension")}
        first = np.asarray([d["key"] not in extension for d in records])
        results["extension_gain"] = {
            split: {"without": held_out(records, test & first, args.seed, fit_on=first),
                    "with": held_out(records, test & first, args.seed)}
            for split, test in (("config", by_config), ("family", by_family))}
    full = CostModel.fit(records, seed=args.seed)
    results["time_share"] = time_shares(full, args.models)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    full.save(out / "cost_model.json.xz")
    (out / "results.json").write_text(json.dumps(results, indent=1))
    share, cum = results["time_share"], 0.0
    print(f"{len(records)} operator samples; held out: 20% of configurations / "
          f"{len(test_fams)} of {len(families)} families")
    print("| type | time share | cum. | samples | median APE (config) | p90 | median APE "
          "(family) | p90 |\n|---|---|---|---|---|---|---|---|")
    count = Counter(d["op_type"] for d in records)
    count.update(k for d in records
                 if (k := OpSpec.from_json(d["spec"]).kind) != d["op_type"])
    count["(all)"] = len(records)
    kinds = sorted(k for k in results["config"] if ":" in k)
    rows = [k for op in share for k in [op, *(k for k in kinds if k.startswith(op + ":"))]]
    for t in rows + ["(all)"]:
        c, f = results["config"].get(t), results["family"].get(t)
        if c is None:
            continue
        cum += share.get(t, 0.0)
        row = [t, f"{100 * share.get(t, 0):.1f}%" if t in share else "",
               f"{100 * cum:.1f}%" if t in share else "", str(count[t]),
               f"{c['median_ape']:.1f}%", f"{c['p90_ape']:.1f}%",
               f"{f['median_ape']:.1f}%" if f else "-", f"{f['p90_ape']:.1f}%" if f else "-"]
        print("| " + " | ".join(row) + " |")
    if args.extension_gain:
        print(f"\nthe same held-out rows of the first plan, median APE without / with the "
              f"{len(records) - int(first.sum())} extension rows\n| type | config (n) | without "
              "| with | family (n) | without | with |\n|---|---|---|---|---|---|---|")
        gain = results["extension_gain"]
        for t in ["Conv", "Gather", *kinds, "(all)"]:
            cells = [t]
            for split in ("config", "family"):
                w, o = gain[split]["with"].get(t), gain[split]["without"].get(t)
                cells += [str(w["n"]), f"{o['median_ape']:.1f}%", f"{w['median_ape']:.1f}%"] \
                    if w else ["0", "-", "-"]
            print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
