"""Whole layers one library call runs, measured by a lent GPU's sweep (`lstm-train`,
`sdpa-biased`, `grid_sample-train`: `mdot_jax.measure.kernel_sweep`), against the spec sheet's
price of the same layer exported from PyTorch.

    python benchmarks/bench_layers.py data/<gpu slug>/kernels.jsonl.xz \
        --out benchmarks/results/layers-<gpu slug>

Pre-registered (docs/studies/whole-layers.md; deformable attention's sampling:
docs/studies/deformable-sampling.md), before any such row was measured. Each row's
layer is exported by `converters.from_torch` at the row's dims (an LSTM batch first: a copy
of its input and output more than the sweep's), its inputs scaled by a parameter first so
that their gradients are made, as the sweep makes them (one elementwise pass more, under 1% of
these layers), and priced by the front door on the GPU the row names, `step fwd-bwd`, SGD
(no update), the forward and backward phases only: the sweep times bursts of launches, the
host's issue time hidden. Precision: the sweep's fp32 as `fp32` (and, for the LSTM, `tf32`:
cuDNN runs an fp32 RNN in TF32 by PyTorch's default, the candidate of the study), fp16 and
bf16 as `amp-fp16` and `amp-bf16`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

KINDS = ("lstm-train", "sdpa-biased", "grid_sample-train")
PRECISIONS = {"fp32": ("fp32", "tf32"), "fp16": ("amp-fp16",), "bf16": ("amp-bf16",)}


def layer(row: dict):
    """(module, example inputs) of a sweep row's layer, its data inputs scaled by parameters."""
    import torch
    import torch.nn.functional as F

    class Lstm(torch.nn.Module):
        def __init__(self, hidden: int, layers: int):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(hidden))
            self.lstm = torch.nn.LSTM(hidden, hidden, layers, batch_first=True)

        def forward(self, x):  # [B, T, H] -> [B, T, H]
            return self.lstm(x * self.scale)[0]

    class Biased(torch.nn.Module):
        def __init__(self, heads: int, tokens: int, dim: int):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(3, dim))
            self.bias = torch.nn.Parameter(torch.zeros(1, heads, tokens, tokens))

        def forward(self, q, k, v):  # [B, h, s, d] each -> [B, h, s, d]
            q, k, v = q * self.scale[0], k * self.scale[1], v * self.scale[2]
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=self.bias.expand(q.shape[0], -1, -1, -1))

    class Sampled(torch.nn.Module):
        def __init__(self, width: int):
            super().__init__()
            self.scale, self.shift = (torch.nn.Parameter(torch.ones(n)) for n in (width, 2))

        def forward(self, level, grid):  # [BH, C, S, S], [BH, Q, P, 2] -> [BH, C, Q, P]
            return F.grid_sample(level * self.scale[:, None, None], grid * self.shift,
                                 mode="bilinear", padding_mode="zeros", align_corners=False)

    if row["kind"] == "lstm-train":
        t, b, h, layers = row["dims"]  # batch first: steps and batch may be equal
        return Lstm(h, layers), torch.randn(b, t, h)
    if row["kind"] == "grid_sample-train":
        bh, c, side, q, points = row["dims"]
        return Sampled(c), (torch.randn(bh, c, side, side), torch.rand(bh, q, points, 2) * 2 - 1)
    b, h, s, d = row["dims"]
    x = torch.randn(b, h, s, d)
    return Biased(h, s, d), (x, x, x)


def prices(row: dict) -> dict[str, float]:
    """The forward and backward phases' ms of a row's layer on its GPU at each precision its
    sweep precision is priced at (`PRECISIONS`)."""
    from converters import convert, from_torch
    from mdot_jax import TrainingJob, predict

    module, example = layer(row)
    batch = row["dims"][1] if row["kind"] == "lstm-train" else row["dims"][0]
    seq = convert(from_torch(module, example), batch_size=batch, fuse=True)
    out = {}
    for precision in PRECISIONS[row["precision"]][:None if row["kind"] == "lstm-train" else 1]:
        p = predict(TrainingJob(model=seq, batch_size=batch, device=row["device"],
                                precision=precision, step="fwd-bwd", optimizer="sgd"))
        out[precision] = p.phases["forward"] + p.phases["backward"]
    return out


def summarize(pairs: list[tuple[float, float]]) -> dict:
    r = np.asarray(pairs, np.float64)  # [N, 2]: priced, measured
    return dict(rows=len(r), mape=float(100 * np.mean(np.abs(r[:, 0] / r[:, 1] - 1))),
                median_ratio=float(np.median(r[:, 0] / r[:, 1])))


def run(rows: list[dict]) -> dict:
    """Per kind, sweep precision and priced precision: MAPE and the median priced / measured;
    each row with its prices."""
    groups: dict[str, list[tuple[float, float]]] = defaultdict(list)
    out, skipped = [], defaultdict(list)
    for row in rows:
        if row["kind"] not in KINDS:
            continue
        if not row.get("ms"):
            skipped[row.get("error", "not measured")].append(row["key"])
            continue
        priced = prices(row)
        for p, ms in priced.items():
            groups[f"{row['kind']}/{row['precision']} as {p}"].append((ms, row["ms"]))
        out.append(dict(key=row["key"], device=row["device"], measured_ms=row["ms"],
                        priced_ms=priced))
    return dict(summary={k: summarize(v) for k, v in sorted(groups.items())}, rows=out,
                skipped=dict(skipped))


def main() -> None:
    from mdot_jax.measure.kernel_sweep import read

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sweep", type=Path, help="a kit's kernels.jsonl (or .jsonl.xz)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    result = dict(command=" ".join(["python", *sys.argv]), **run(read(args.sweep)))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    for k, v in result["summary"].items():
        print(f"{k:<32} {v['rows']:>3} rows  MAPE {v['mape']:5.1f}%  "
              f"median {v['median_ratio']:.2f}")


if __name__ == "__main__":
    main()
