"""The additivity check: is a training iteration the sum of its operators' measured costs?

    python benchmarks/bench_additivity.py data/derived/cpu-amd-epyc-f25m17-2t-fused \
        --cost benchmarks/results/kernels-cpu-amd-epyc-f25m17-2t/cost_model.json.xz \
        --out benchmarks/results/cpu-amd-epyc-f25m17-2t-additivity

Every sample's graph is priced operator by operator by the kernel cost model of the same
device (plus the loss), and compared with the measured iteration:
- `sum`: the plain sum;
- `sum + c`: plus one per-iteration constant `c` (framework and optimizer overhead), the
  median of measured - sum over all samples;
- `a * sum + c`: a line fitted in least squares over all samples (relative errors);
- `+ d * ops`: that line plus a cost per operator (eager dispatch and autograd bookkeeping);
- `per kind`: one scale per kind of operator (dense, depthwise and grouped Conv, MatMul and
  Gemm, BatchNormalization, the rest) and c: operators priced too cheaply in isolation;
- `+ e * params`: the line plus a cost per parameter (weights, gradients and momentum
  streamed from memory when the model outgrows the caches; docs/operators.md section 13).
Per family: samples, median measured / sum, and the MAPE of each. No learning from model
labels beyond those two or three numbers: this is how far composition alone gets.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from mdot_jax.data.dataset import load_dataset
from mdot_jax.ops.cost import CostModel, OpSumLine
from mdot_jax.ops.specs import specs_of

KINDS = (("Conv:dense",), ("Conv:depthwise",), ("Conv:grouped",), ("MatMul", "Gemm"),
         ("BatchNormalization",))  # `per kind`'s scales; everything else shares one


def kind_sums(model: CostModel, samples) -> np.ndarray:
    """`[S, len(KINDS) + 1]` predicted ms of each sample's operators per kind (the last column:
    every other operator, and the loss); summed, the graph's operator sum."""
    out = np.zeros((len(samples), len(KINDS) + 1))
    column = {k: i for i, kinds in enumerate(KINDS) for k in kinds}
    for i, s in enumerate(samples):
        for spec, ms in zip(specs_of(s.seq), model.sequence_ms(s.seq)):
            out[i, column.get(spec.kind, len(KINDS))] += ms
        out[i, -1] += model.loss_ms(s.workload.batch_size,
                                    2 if s.meta.get("kind") == "text" else 1000)
    return out


def relative_fit(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """`[S]` predictions of `x @ w` (`x`: `[S, K]`), `w` minimising relative squared error."""
    return x @ np.linalg.lstsq(x / y[:, None], np.ones_like(y), rcond=None)[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dataset")
    p.add_argument("--cost", required=True, help="cost_model.json.xz (bench_kernels.py)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    samples = load_dataset(args.dataset).samples
    model = CostModel.load(args.cost)
    y = np.asarray([s.label_ms for s in samples])
    kinds = kind_sums(model, samples)
    s_ = kinds.sum(1)
    c = float(np.median(y - s_))
    # a * sum + c minimising relative squared error: weights 1/y
    w = 1.0 / y
    a_fit, c_fit = np.linalg.lstsq(np.stack([s_ * w, w], 1), np.ones_like(y), rcond=None)[0]
    ones, ops = np.ones_like(y), np.asarray([smp.seq.num_ops for smp in samples], float)
    params = OpSumLine.params(samples)
    preds = {"sum": s_, "sum + c": s_ + c, "a * sum + c": a_fit * s_ + c_fit,
             "+ d * ops": relative_fit(np.stack([s_, ones, ops], 1), y),
             "per kind": relative_fit(np.column_stack([kinds, ones]), y),
             "+ e * params": relative_fit(np.stack([s_, ones, params], 1), y)}

    def mape(pred, idx):
        return 100 * float(np.mean(np.abs(pred[idx] / y[idx] - 1)))

    fams = defaultdict(list)
    for i, smp in enumerate(samples):
        fams[smp.family].append(i)
    per_family = {f: dict(n=len(ix), median_ratio=float(np.median(y[ix] / s_[ix])),
                          **{k: mape(v, ix) for k, v in preds.items()})
                  for f, ix in sorted(fams.items())}
    everything = np.arange(len(y))
    results = dict(dataset=args.dataset, cost_model=args.cost, samples=len(y), c_ms=c,
                   a=float(a_fit), c_fit_ms=float(c_fit),
                   median_ratio=float(np.median(y / s_)),
                   mape={k: mape(v, everything) for k, v in preds.items()},
                   per_family=per_family)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"{len(y)} samples: measured / sum median {results['median_ratio']:.2f}; "
          f"c = {c:.2f} ms; a = {a_fit:.3f}, c = {c_fit:.2f} ms")
    print("MAPE: " + ", ".join(f"{k} {v:.1f}%" for k, v in results["mape"].items()))
    print("| family | samples | measured / sum | MAPE " + " | ".join(preds) + " |\n"
          + "|---" * (3 + len(preds)) + "|")
    for f, r in sorted(per_family.items(), key=lambda kv: -kv[1]["sum + c"]):
        print(f"| {f} | {r['n']} | {r['median_ratio']:.2f} | "
              + " | ".join(f"{r[k]:.1f}%" for k in preds) + " |")


if __name__ == "__main__":
    main()
