"""An 80% band for Megatron-LM iterations on A100s, from vTrain's measured ones, decided by
leave-one-model-out coverage (`docs/studies/megatron-band.md`: the rule, written before any
residual was read).

    python benchmarks/bench_vtrain.py ../shared/datasets/vtrain --framework megatron --out DIR
    python benchmarks/bench_megatron_band.py ../shared/datasets/vtrain \
        --predictions DIR/predictions.jsonl --out benchmarks/results/megatron-band \
        [--ship checkpoints/gpu-spec-sheet]

The rows (vTrain, Bang et al., MICRO 2024, VIA-Research/vTrain, read in place, never copied):
every single-node row of the six models the Megatron host was not chosen on
(`CALIBRATION`: its two models' 360 rows are left out, their residuals in-sample) and every
multi-node row; a model is its (hidden size, layers). Each row's residual is
log(measured / predicted), the prediction `bench_vtrain.py --framework megatron`'s at the
commit it runs at. Leave one model out: the band is the 10th and 90th percentiles of the
other models' residuals, each model weighing the same (its rows sharing its weight); its
coverage is the share of the held-out model's rows inside it. Adopted if the mean coverage
over the models lies in 70-90% and none is below 50%; then `--ship` writes the band of every
model's rows (weighted alike) into the step model's metadata (`megatron_band`), with the op
types of the models it was measured on. Written: per model its rows, coverage, the band from
the others and the median predicted / measured; never a measured time.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_vtrain import VOCAB, _rows  # noqa: E402

CALIBRATION = {(1024, 12), (2048, 24)}  # single-node models the Megatron host was chosen on
QUANTILES = (0.1, 0.9)
COVERAGE = (0.70, 0.90)  # the mean's range
LEAST = 0.50  # no model below
GPUS = ("nvidia-a100-sxm-80gb", "nvidia-a100-sxm-40gb")  # vTrain's A100s (the size unstated)
PRECISIONS = ("amp-fp16", "amp-bf16")  # Megatron's mixed precision (which one unstated)


def weighted_quantiles(values: list[np.ndarray], qs=QUANTILES) -> tuple[float, ...]:
    """The `qs` quantiles of the pooled `values`, each array weighing the same in all."""
    x = np.concatenate(values)
    w = np.concatenate([np.full(len(v), 1.0 / len(v)) for v in values])
    order = np.argsort(x)
    x, cum = x[order], np.cumsum(w[order])
    mid = (cum - 0.5 * w[order]) / cum[-1]  # each value at its weight's midpoint
    return tuple(float(np.interp(q, mid, x)) for q in qs)


def residuals(rows: list[dict], predicted: dict[str, float]) -> dict[tuple, np.ndarray]:
    """log(measured / predicted) of the rule's rows, by model (hidden, layers)."""
    out: dict[tuple, list[float]] = {}
    for r in rows:
        model = (r["hidden"], r["layers"])
        if (not r["multi"] and model in CALIBRATION) or r["key"] not in predicted:
            continue
        out.setdefault(model, []).append(float(np.log(r["ms"] / predicted[r["key"]])))
    return {m: np.asarray(v) for m, v in sorted(out.items())}


def leave_one_model_out(by_model: dict[tuple, np.ndarray]) -> dict:
    folds = {}
    for m, held in by_model.items():
        lo, hi = weighted_quantiles([v for k, v in by_model.items() if k != m])
        folds[f"{m[0]}x{m[1]}"] = dict(
            rows=len(held), band=[float(np.exp(lo)), float(np.exp(hi))],
            coverage=float(np.mean((held >= lo) & (held <= hi))),
            median_predicted_over_measured=float(np.exp(-np.median(held))))
    cover = [f["coverage"] for f in folds.values()]
    mean = float(np.mean(cover))
    return dict(folds=folds, mean_coverage=mean, least_coverage=float(min(cover)),
                adopted=bool(COVERAGE[0] <= mean <= COVERAGE[1] and min(cover) >= LEAST))


def op_types() -> list[str]:
    """The operator types of the models the band was measured on: a GPT-2-style decoder as
    `bench_vtrain.py` builds them (any size: the same types)."""
    from converters import convert, from_hf_config

    seq = convert(from_hf_config(dict(model_type="gpt2", n_embd=64, n_head=4, n_layer=2,
                                      n_positions=128, vocab_size=VOCAB,
                                      activation_function="gelu"), seq_len=128),
                  batch_size=2, seq_len=128, fuse=True)
    return sorted(map(str, set(seq.op_names)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", type=Path, help="vTrain's data folder")
    ap.add_argument("--predictions", type=Path, required=True,
                    help="bench_vtrain.py --framework megatron's predictions.jsonl")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ship", type=Path, help="a step model folder to write the band into "
                    "(only where the rule adopts it)")
    args = ap.parse_args(argv)

    predicted = {d["key"]: d["predicted_ms"] for d in map(
        json.loads, args.predictions.read_text().splitlines())}
    by_model = residuals(_rows(args.data), predicted)
    result = leave_one_model_out(by_model)
    lo, hi = weighted_quantiles(list(by_model.values()))
    band = dict(lo=lo, hi=hi, rows=sum(map(len, by_model.values())), models=len(by_model),
                mean_coverage=result["mean_coverage"], gpus=list(GPUS),
                precisions=list(PRECISIONS), op_types=op_types(),
                source="vTrain: Bang et al., MICRO 2024, VIA-Research/vTrain")
    result.update(band=[float(np.exp(lo)), float(np.exp(hi))], rows=band["rows"],
                  rule=dict(quantiles=QUANTILES, mean_coverage=COVERAGE, least=LEAST,
                            calibration_left_out=sorted(map(list, CALIBRATION))))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    for name, f in result["folds"].items():
        print(f"{name:>10} {f['rows']:>4} rows  band {f['band'][0]:.3f}-{f['band'][1]:.3f}  "
              f"coverage {f['coverage']:.0%}  median ratio "
              f"{f['median_predicted_over_measured']:.3f}")
    print(f"mean coverage {result['mean_coverage']:.1%}, least {result['least_coverage']:.1%}: "
          f"{'adopted' if result['adopted'] else 'not adopted'}; all models' band "
          f"{result['band'][0]:.3f}-{result['band'][1]:.3f} x predicted")
    if args.ship and result["adopted"]:
        meta = args.ship / "step_model.json"
        doc = json.loads(meta.read_text())
        doc["megatron_band"] = band
        tmp = meta.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        tmp.replace(meta)
        print(f"wrote megatron_band into {meta}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
