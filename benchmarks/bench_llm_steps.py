"""The kit's measured LLM steps (`llm-steps.jsonl`, `mdot_jax.measure.llm_steps`) against the
spec sheet: each row's model rebuilt from its config, priced by the front door with the job
the row carries, on the GPU it names.

    python benchmarks/bench_llm_steps.py data/<gpu slug>/llm-steps.jsonl \
        --out benchmarks/results/llm-steps-<gpu slug>

The rule, written before any such row exists: every measured row (not an out-of-memory one)
priced once, nothing fitted; reported per attention kind and checkpointing: MAPE, the median
ratio predicted / measured, and the memory estimate against the peak allocated. Rows measured
on a device the catalog does not know are listed as skipped, with the name.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np


def price(rows: list[dict], checkpoint: str | None = None) -> tuple[list[dict], list[str]]:
    """Each measured row with `predicted_ms` and `memory_gb`; the skipped rows' reasons."""
    from mdot_jax.errors import MdotError
    from mdot_jax.gpu import catalog
    from mdot_jax.serving.front import predict
    from mdot_jax.serving.request import TrainingJob

    out, skipped = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in rows:
            gpu = catalog.lookup(str(r.get("device", "")))
            if "ms" not in r or gpu is None:
                skipped.append(f"{r['key']}: {r.get('error') or 'device ' + repr(r.get('device'))}")
                continue
            config = Path(tmp) / f"{abs(hash(json.dumps(r['config'], sort_keys=True)))}.json"
            config.write_text(json.dumps(r["config"]))
            try:
                p = predict(TrainingJob(model=str(config), device=gpu.name, checkpoint=checkpoint,
                                        **r["job"]))
            except MdotError as e:
                skipped.append(f"{r['key']}: {e}")
                continue
            out.append(dict(key=r["key"], measured_ms=r["ms"], predicted_ms=p.iteration_ms,
                            peak_gb=r.get("peak_gb"), memory_gb=p.memory_gb,
                            attention=r["job"]["attention"],
                            checkpointing=r["job"]["activation_checkpointing"] or "none"))
    return out, skipped


def summarize(priced: list[dict]) -> dict:
    groups: dict[str, list[dict]] = {"all": priced}
    for r in priced:
        groups.setdefault(f"{r['attention']}/{r['checkpointing']}", []).append(r)
    summary = {}
    for name, rows in groups.items():
        ratio = np.asarray([r["predicted_ms"] / r["measured_ms"] for r in rows])
        mem = [r["memory_gb"] / r["peak_gb"] for r in rows if r.get("peak_gb")]
        summary[name] = dict(rows=len(rows), mape=float(100 * np.mean(np.abs(ratio - 1))),
                             median_ratio=float(np.median(ratio)),
                             memory_within_20pct=float(np.mean(np.abs(np.asarray(mem) - 1)
                                                               <= 0.2)) if mem else None)
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("steps", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    rows = [json.loads(x) for x in args.steps.read_text().splitlines() if x.strip()]
    priced, skipped = price(rows)
    summary = summarize(priced) if priced else {}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(dict(
        source=str(args.steps), summary=summary, skipped=skipped, rows=priced), indent=1) + "\n")
    for name, s in summary.items():
        print(f"{name:<16} {s['rows']:>3} rows  MAPE {s['mape']:5.1f}%  median ratio "
              f"{s['median_ratio']:.2f}")
    print(f"{len(priced)} priced, {len(skipped)} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
