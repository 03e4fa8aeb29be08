"""The kit's measured LLM steps (`llm-steps.jsonl`, `mdot_jax.measure.llm_steps`) against the
spec sheet: each row's model rebuilt from its config, priced by the front door with the job
the row carries, on the GPU it names.

    python benchmarks/bench_llm_steps.py data/<gpu slug>/llm-steps.jsonl \
        --out benchmarks/results/llm-steps-<gpu slug>

The rule, written before any such row exists: every measured row (not an out-of-memory one)
priced once, nothing fitted; reported per attention kind and checkpointing: MAPE, the median
ratio predicted / measured, and the memory estimate against the peak allocated; for rows
traced on a GPU, the GPU's busy time against the priced kernel time and its share by kernel
class (`measure.profiler.kernel_class`). Rows measured on a device the catalog does not know
are listed as skipped, with the name.

LoRA rows (keys ending `/lora16`; the kit measures them after the mixtures of experts) are
a group of their own, and each one's step over its fully trained twin's, measured and priced
(`lora_over_full`). Pre-registered, before any LoRA row exists: the pricing of frozen
parameters (`mdot_jax.autograd`) stays as it is if, for both LoRA rows of a lease, the priced
ratio lies within 15% of the measured one; otherwise the traced kernels' classes say which
mechanism is the next study, its rule written before it is priced.

Compiled rows (keys ending `/compiled`: `torch.compile`, Inductor's default mode; the kit
measures them in a step of their own after the fp32 GPU set) likewise, each over its eager
twin (`compiled_over_eager`). Pre-registered, before any compiled row exists
(docs/studies/compiled-steps.md): the pricing of compiled steps (`mdot_jax.gpu.compiled`)
stays as it is if, for every compiled row a lease brings with its eager twin, the priced
ratio lies within 15% of the measured one; otherwise the traced kernels (generated ones apart
from the libraries') say which part is the next study: the fusion's bytes or the host's time a
kernel.

The Muon row (key ending `/muon`: torch.optim.Muon over the 124M's weight matrices, AdamW over
the rest) likewise over its AdamW twin (`muon_over_adamw`). Pre-registered, before any Muon row
exists (docs/studies/muon.md): the pricing of Muon's update (`mdot_jax.gpu.muon`) stays as it
is if the priced ratio lies within 15% of the measured one; otherwise the trace (the update's
GEMMs against its launches) names the next study.

The pure bf16 rows (keys ending `/bf16`: the 124M and the 1.3B with `model.to(torch.bfloat16)`,
no autocast) likewise over their autocast twins (`bf16_over_amp`). Pre-registered, before any
such row exists: the pricing of `precision bf16` (no casts, two bytes an element, torch.optim's
state in bf16) stays as it is if, for both rows of a lease, the priced ratio lies within 15% of
the measured one and the memory estimate within 20% of the peak; otherwise the traces say
which kernels it misses, the next study's rule written before it is priced.

For traced rows, priced over traced GPU time by kernel class (`priced_over_traced_by_class`):
the readings of docs/studies/gemm-bound-step.md, whose rule was written before any traced LLM
step existed.

The step memory's loss and autocast's weight copies (cause 3 of
docs/studies/llm-step-memory.md) were a candidate here, adopted on the H100's third lease: the
shipped estimate holds them (`serving.memory`).

Pre-registered, before the next lease's rows exist (`--experts-fp32`;
docs/studies/moe-experts-amp.md): a mixture of experts' step with its experts' GEMMs at fp32,
as transformers' experts run under autocast: the row's AMP price, less what its expert nodes
(`.../experts/...`, `converters.experts`) cost there, plus what they cost in the same job at
fp32 (`candidate_ms`; rows without experts keep their price). The rule is the page's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

import numpy as np


def price(rows: list[dict], checkpoint: str | None = None, experts_fp32: bool = False
          ) -> tuple[list[dict], list[str]]:
    """Each measured row with `predicted_ms` and `memory_gb` (and the candidate's
    `candidate_ms`, `experts_fp32`); the skipped rows' reasons."""
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
            try:  # a job the request refuses is skipped with its reason, as one pricing fails
                job = TrainingJob(model=str(config), device=gpu.name, checkpoint=checkpoint,
                                  operators=True, **r["job"])
                p = predict(job)
            except MdotError as e:
                skipped.append(f"{r['key']}: {e}")
                continue
            out.append(dict(key=r["key"], measured_ms=r["ms"], predicted_ms=p.iteration_ms,
                            peak_gb=r.get("peak_gb"), memory_gb=p.memory_gb,
                            attention=r["job"]["attention"],
                            checkpointing=r["job"]["activation_checkpointing"] or "none",
                            lora=r["job"].get("lora_rank"), compiled=r["job"].get("compile"),
                            optimizer=r["job"]["optimizer"], precision=r["job"]["precision"],
                            mfu=p.mfu,  # measured: the same model FLOPs over the measured time
                            measured_mfu=p.mfu and p.mfu * p.iteration_ms / r["ms"]))
            if experts_fp32:
                out[-1]["candidate_ms"] = p.iteration_ms + experts_at_fp32(
                    p, dataclasses.replace(job, precision="fp32"))
            if r.get("gpu_ms"):  # traced on a GPU: the GPU's busy time against the priced
                gpu_ms, by_class = kernels_only(r)
                out[-1]["trace"] = dict(
                    gpu_ms=gpu_ms, kernels=r["kernels"], launches=r["launches"],
                    predicted_gpu_ms=p.iteration_ms - p.phases.get("launch gaps", 0.0),
                    phases=p.phases, by_class=by_class,
                    priced_by_class=priced_by_class(p.operators or []),
                    callers=r.get("callers"))  # who ran the time (newer kit traces)
    return out, skipped


def kernels_only(row: dict) -> tuple[float, dict[str, float]]:
    """A traced row's GPU busy time and ms by kernel class without the ranges the code marked
    (`profiler.is_annotation`: torch.optim's `Optimizer.step#...`), which traces before the
    profiler left them out counted as kernels: taken off where the row's busiest list names
    them (the optimizer's span always is, being as long as its kernels)."""
    from mdot_jax.measure.profiler import is_annotation, kernel_class

    by_class = {c: t for c, (_, t) in row.get("by_class", {}).items()}
    spans = [(name, t) for name, _, t in row.get("busiest", []) if is_annotation(name)]
    for c, t in ((kernel_class(name), t) for name, t in spans):
        by_class[c] = by_class.get(c, 0.0) - t
    return row["gpu_ms"] - sum(t for _, t in spans), by_class


# the priced operators' types by the trace's kernel class (`measure.profiler.KERNEL_CLASSES`);
# the rest of the GPU's time is compared as one class
TYPE_CLASS = {"Gemm": "gemm", "MatMul": "gemm", "attention (fused)": "attention",
              "optimizer": "optimizer"}
COMPARED = ("gemm", "attention", "optimizer")


def priced_by_class(operators: list[dict]) -> dict[str, float]:
    """ms of the priced operators by kernel class (`TYPE_CLASS`; the host's gaps left out)."""
    out = dict.fromkeys((*COMPARED, "rest"), 0.0)
    for o in operators:
        if o["type"] != "launch gaps":
            out[TYPE_CLASS.get(o["type"], "rest")] += float(o["ms"])
    return out


def class_ratios(trace: dict) -> dict[str, float]:
    """Priced / traced GPU time of one traced row by class (`COMPARED`, and the rest)."""
    traced = {c: trace["by_class"].get(c, 0.0) for c in COMPARED}
    traced["rest"] = trace["gpu_ms"] - sum(traced.values())
    return {c: trace["priced_by_class"][c] / t for c, t in traced.items() if t > 0}


def experts_at_fp32(p, fp32_job) -> float:
    """ms the candidate adds to `p` (an AMP step's prediction, with its operators): its expert
    nodes' time priced in `fp32_job` (the same job at fp32) less theirs in `p`; 0 without
    experts."""
    from mdot_jax.serving.front import predict

    def experts_ms(q) -> float:
        return sum(o["ms"] for o in q.operators or [] if "/experts/" in o["name"])

    amp = experts_ms(p)
    return experts_ms(predict(fp32_job)) - amp if amp else 0.0


# results' readings: each row whose key carries the mark over its twin's (the same model and
# tokens, measured in the same run, the key without the mark), measured and priced
TWINS = {"lora_over_full": "/lora", "compiled_over_eager": "/compiled",
         "muon_over_adamw": "/muon", "bf16_over_amp": "/bf16"}


def over_twin(priced: list[dict], mark: str) -> dict[str, dict]:
    """Each row marked `mark` (`TWINS`) over its twin's step, measured and priced."""
    by_key = {r["key"]: r for r in priced}
    out = {}
    for r in priced:
        twin = by_key.get(r["key"].rsplit(mark, 1)[0]) if mark in r["key"] else None
        if twin:
            out[r["key"]] = dict(measured=r["measured_ms"] / twin["measured_ms"],
                                 priced=r["predicted_ms"] / twin["predicted_ms"])
    return out


def summarize(priced: list[dict]) -> dict:
    groups: dict[str, list[dict]] = {"all": priced}
    for r in priced:
        groups.setdefault(f"{r['attention']}/{r['checkpointing']}"
                          + ("/lora" if r.get("lora") else "")
                          + ("/compiled" if r.get("compiled") else "")
                          + ("/muon" if r.get("optimizer") == "muon" else "")
                          + ("/bf16" if r.get("precision") == "bf16" else ""), []).append(r)
    summary = {}
    for name, rows in groups.items():
        ratio = np.asarray([r["predicted_ms"] / r["measured_ms"] for r in rows])
        summary[name] = dict(rows=len(rows), mape=float(100 * np.mean(np.abs(ratio - 1))),
                             median_ratio=float(np.median(ratio)))
        if mfu := [r["measured_mfu"] for r in rows if r.get("measured_mfu")]:
            summary[name]["measured_mfu"] = [float(min(mfu)), float(max(mfu))]
        mem = np.asarray([r["memory_gb"] / r["peak_gb"] for r in rows if r.get("peak_gb")])
        if len(mem):
            summary[name]["memory_within_20pct"] = float(np.mean(np.abs(mem - 1) <= 0.2))
            summary[name]["memory_median_abs_error"] = float(np.median(np.abs(mem - 1)))
        if cand := [r["candidate_ms"] / r["measured_ms"] for r in rows if "candidate_ms" in r]:
            summary[name]["candidate_mape"] = float(100 * np.mean(np.abs(np.subtract(cand, 1))))
        traced = [(r["trace"], r["measured_ms"]) for r in rows if "trace" in r]
        if traced:  # where the time went: the GPU busy (by kernel class) or waiting on the host
            classes = sorted({c for t, _ in traced for c in t["by_class"]})
            summary[name]["traced"] = dict(
                rows=len(traced),
                gpu_busy_share=float(np.median([t["gpu_ms"] / ms for t, ms in traced])),
                predicted_gpu_ratio=float(np.median([t["predicted_gpu_ms"] / t["gpu_ms"]
                                                     for t, _ in traced])),
                gpu_share_by_class={c: float(np.median([t["by_class"].get(c, 0.0) / t["gpu_ms"]
                                                        for t, _ in traced])) for c in classes},
                priced_over_traced_by_class={c: float(np.median(v)) for c, v in _by_key(
                    [class_ratios(t) for t, _ in traced]).items()})
    return summary


def _by_key(dicts: list[dict]) -> dict[str, list]:
    out: dict[str, list] = {}
    for d in dicts:
        for k, v in d.items():
            out.setdefault(k, []).append(v)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("steps", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--experts-fp32", action="store_true",
                    help="also the pre-registered candidate's price (module docstring)")
    args = ap.parse_args(argv)
    rows = [json.loads(x) for x in args.steps.read_text().splitlines() if x.strip()]
    priced, skipped = price(rows, experts_fp32=args.experts_fp32)
    summary = summarize(priced) if priced else {}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(dict(
        source=str(args.steps), summary=summary,
        **{name: over_twin(priced, mark) for name, mark in TWINS.items()},
        skipped=skipped, rows=priced), indent=1) + "\n")
    for name, s in summary.items():
        print(f"{name:<16} {s['rows']:>3} rows  MAPE {s['mape']:5.1f}%  median ratio "
              f"{s['median_ratio']:.2f}")
    print(f"{len(priced)} priced, {len(skipped)} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
