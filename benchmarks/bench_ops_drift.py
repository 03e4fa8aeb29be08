"""Do operator labels measured in different sessions agree? Re-measures a seeded sample of an
operator folder's rows now, on the same device, and compares with their labels.

    python benchmarks/bench_ops_drift.py data/cpu-amd-epyc-f25m17-2t/ops \
        --kinds Conv:dense,Conv:depthwise,Conv:grouped --per-kind 80 \
        --out benchmarks/results/ops-drift-cpu-amd-epyc-f25m17-2t

Rows are grouped by when they were measured (the day of `measured_at`), so the rows measured
earlier today are the control: their ratio shows what re-measuring alone moves, and the
older days' ratios beyond it show the drift of the machine between sessions. `--pass 2`
measures the same rows once more (`remeasured-2.jsonl`) and compares the passes row for row:
what the same machine gives minutes apart. A measurement: run it alone on the machine.
Resumable (`remeasured-<pass>.jsonl`, append-only; a row measured once in a pass is not
measured again).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from mdot_jax.data.profile import device_slug, fingerprint
from mdot_jax.ops.profile import OpProtocol, measure_op, read_op_samples
from mdot_jax.ops.specs import OpSpec


def pick(records: list[dict], kinds: list[str], per_kind: int, seed: int) -> list[dict]:
    """`per_kind` rows of every (kind, day) at most, seeded."""
    groups = defaultdict(list)
    for d in records:
        kind = OpSpec.from_json(d["spec"]).kind
        if kind in kinds:
            groups[(kind, d["meta"]["measured_at"][:10])].append(d)
    rng = np.random.default_rng(seed)
    out = []
    for key in sorted(groups):
        rows = groups[key]
        out += [rows[i] for i in sorted(rng.choice(len(rows), min(per_kind, len(rows)),
                                                   replace=False))]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("ops")
    p.add_argument("--kinds", default="Conv:dense,Conv:depthwise,Conv:grouped")
    p.add_argument("--per-kind", type=int, default=80)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reference", action="store_true",
                   help="time a fixed reference convolution before every row (`ref_ms`): "
                        "whether the machine's slow spells are common to all operators")
    p.add_argument("--pass", type=int, default=1, dest="pass_", help="a second pass re-measures "
                   "the same rows and is compared with the first")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    import torch
    from tqdm import tqdm

    torch.set_num_threads(args.threads)
    records = read_op_samples(args.ops)
    slug = device_slug(fingerprint(args.threads))
    devices = {d["meta"]["device"] for d in records}
    if devices != {slug}:
        raise SystemExit(f"{args.ops} holds {sorted(devices)}; this machine is {slug}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"remeasured-{args.pass_}.jsonl"
    done = {json.loads(line)["key"] for line in path.read_text().splitlines()} \
        if path.exists() else set()
    rows = pick(records, args.kinds.split(","), args.per_kind, args.seed)
    reference = OpSpec.from_json(rows[len(rows) // 2]["spec"])  # fixed by the seed

    def ms(spec: OpSpec) -> dict:
        return measure_op(spec, OpProtocol(), torch, "cpu", args.threads)

    with path.open("a") as f:
        for d in tqdm([d for d in rows if d["key"] not in done], desc="re-measure", unit="op"):
            ref = ms(reference) if args.reference else None
            st = ms(OpSpec.from_json(d["spec"]))
            f.write(json.dumps(dict(
                key=d["key"], kind=OpSpec.from_json(d["spec"]).kind,
                measured_at=d["meta"]["measured_at"], label_ms=d["label_ms"],
                now_ms=st["median_ms"] + st["update_ms"], spread=st["spread"],
                noisy=st["noisy"], ref_ms=ref and ref["median_ms"] + ref["update_ms"])) + "\n")
            f.flush()
    got = [json.loads(line) for line in path.read_text().splitlines()]
    table = defaultdict(list)
    for r in got:
        if not r["noisy"]:
            table[(r["kind"], r["measured_at"][:10])].append(np.log(r["now_ms"] / r["label_ms"]))
    print("| kind | measured on | rows | median now / label | IQR of the ratio | within 10% |\n"
          "|---|---|---|---|---|---|")
    summary = {}
    for (kind, day), v in sorted(table.items()):
        v = np.asarray(v)
        q1, q2, q3 = np.exp(np.percentile(v, [25, 50, 75]))
        within = float(np.mean(np.abs(np.exp(v) - 1) <= 0.1))
        summary[f"{kind} {day}"] = dict(n=len(v), median_ratio=q2, q1=q1, q3=q3, within10=within)
        print(f"| {kind} | {day} | {len(v)} | {q2:.3f} | {q1:.3f}-{q3:.3f} | {100 * within:.0f}% |")
    first = out / "remeasured-1.jsonl"
    if args.pass_ > 1 and first.exists():
        before = {r["key"]: r for r in map(json.loads, first.read_text().splitlines())}
        pairs = defaultdict(list)
        for r in got:
            b = before.get(r["key"])
            if b and not (b["noisy"] or r["noisy"]):
                pairs[r["kind"]].append(np.log(r["now_ms"] / b["now_ms"]))
        print(f"\n| kind | rows | median pass {args.pass_} / pass 1 | IQR | within 10% |\n"
              "|---|---|---|---|---|")
        for kind, v in sorted(pairs.items()):
            v = np.asarray(v)
            q1, q2, q3 = np.exp(np.percentile(v, [25, 50, 75]))
            within = float(np.mean(np.abs(np.exp(v) - 1) <= 0.1))
            summary[f"{kind} pass {args.pass_} / pass 1"] = dict(
                n=len(v), median_ratio=q2, q1=q1, q3=q3, within10=within)
            print(f"| {kind} | {len(v)} | {q2:.3f} | {q1:.3f}-{q3:.3f} | {100 * within:.0f}% |")
    (out / f"results-{args.pass_}.json").write_text(json.dumps(dict(
        summary=summary, noisy=sum(r["noisy"] for r in got), device=slug,
        command=vars(args)), indent=1))


if __name__ == "__main__":
    main()
