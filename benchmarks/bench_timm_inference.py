"""timm's inference tables (PyTorch 2.4, AMP fp16, NCHW; an RTX 3090 and an RTX 4090, neither
fitted on) against the spec sheet's price of the forward alone: each sampled model exported
at the table's image size, converted at the table's batch, every parameter frozen (so no
backward and no update is priced), priced on the table's GPU at amp-fp16 with PyTorch's
attention (fused where the model calls SDPA, as the export records; as the graph shows it
where its code computes attention itself).

    python benchmarks/bench_timm_inference.py ../shared/datasets/timm-rtx3090 --gpu rtx3090 \
        --onnx /tmp/timm-onnx --out benchmarks/results/timm-inference-rtx3090

Data: timm's public results tables (Ross Wightman, PyTorch Image Models, Apache-2.0), read in
place; declared evaluation data, nothing fitted on them. The sample, fixed before any row was
priced: models in both GPUs' inference tables and in the RTX 3090 training table (they export),
not timm's `test_*` nets, at most 120M parameters, at the same batch on both GPUs; sorted by
name, every fourth. Models the exporter refuses are listed as skipped, with the reason.

What it measures and what it does not: an inference forward runs batch norm with its running
statistics (one pass) where the priced training-mode forward computes the batch's, so CNNs
with batch norm are priced slower than they run; the transformer rows (no batch norm) are the
cleaner reading. Reported by kind (`bench_tensor_cores._kind`: with self-attention or not):
MAPE and the median ratio priced / measured. Exports are kept in `--onnx` (resumable); rows
are written as priced (our prices alone: timm's measured times are read from its tables each
run, never written here).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_tensor_cores import _kind  # noqa: E402

TABLES = {g: f"benchmark-infer-amp-nchw-pt240-cu124-{g}.csv" for g in ("rtx3090", "rtx4090")}
TRAIN = "benchmark-train-amp-nchw-pt112-cu113-rtx3090.csv"
MAX_PARAMS_M = 120.0
EVERY = 4


def sample(folder: Path) -> tuple[list[str], dict[str, dict]]:
    """(the sampled models, by GPU the inference table's rows by model): the docstring's rule."""
    def read(name: str) -> dict[str, dict]:
        with open(folder / name, newline="") as f:
            return {r["model"]: r for r in csv.DictReader(f)}

    tabs = {g: read(f) for g, f in TABLES.items()}
    trained = set(read(TRAIN))
    a, b = tabs["rtx3090"], tabs["rtx4090"]
    names = sorted(k for k in a if k in b and k in trained and not k.startswith("test_")
                   and float(a[k]["param_count"]) <= MAX_PARAMS_M
                   and a[k]["infer_batch_size"] == b[k]["infer_batch_size"])
    return names[::EVERY], tabs


def export(model: str, image_size: int, folder: Path) -> Path:
    """The model's weight-free training graph at `image_size` (kept; a ConversionError or a
    timm error raises)."""
    import onnx
    import timm
    import torch

    from converters import from_torch

    out = folder / f"{model}.onnx"
    if not out.exists():
        graph = from_torch(timm.create_model(model, pretrained=False),
                           torch.randn(2, 3, image_size, image_size))
        part = out.with_suffix(".part")
        onnx.save(graph, part)
        part.replace(out)
    return out


def forward_ms(path: Path, batch: int, gpu, model) -> tuple[float, str]:
    """The spec sheet's price of the forward alone at `batch` (every parameter frozen), and the
    model's kind (`bench_tensor_cores._kind`)."""
    from converters import convert
    from converters.attention import attention_blocks, calling_sdpa
    from converters.sequence import LOAD_FIELDS
    from mdot_jax.gpu import spec_sheet

    seq = convert(str(path), batch_size=batch, fuse=True)
    kind = _kind(seq)
    holders = np.flatnonzero(seq.load[:, LOAD_FIELDS.index("params")] > 0)
    seq = dataclasses.replace(seq, meta={**seq.meta, "frozen": int(seq.params),
                                         "frozen_nodes": [int(i) for i in holders]})
    blocks = calling_sdpa(seq, attention_blocks(seq))  # fused, as the front door's default
    return spec_sheet.price(seq, gpu, model, precision="amp-fp16", step="fwd-bwd", fit=False,
                            attention="flash" if blocks else "eager", blocks=blocks
                            ).iteration_ms, kind


def summary(rows: list[dict]) -> dict:
    out = {}
    for kind in ("all", "cnn", "transformer"):
        r = np.array([x["priced_ms"] / x["measured_ms"] for x in rows
                      if kind == "all" or x["kind"] == kind])
        if len(r):
            out[kind] = dict(rows=len(r), mape=float(100 * np.mean(np.abs(r - 1))),
                             median_ratio=float(np.median(r)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tables", type=Path, help="the folder of timm's results tables")
    ap.add_argument("--gpu", choices=sorted(TABLES), required=True)
    ap.add_argument("--onnx", type=Path, required=True, help="where exports are kept")
    ap.add_argument("--model", default=None, help="a step model folder (default: shipped)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    from mdot_jax.gpu import catalog, spec_sheet

    gpu, model = catalog.lookup(args.gpu), spec_sheet.load_step_model(args.model)
    names, tabs = sample(args.tables)
    args.onnx.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    rows_file = args.out / "rows.jsonl"
    done = {json.loads(line)["model"]: json.loads(line) for line in
            rows_file.read_text().splitlines()} if rows_file.exists() else {}
    skipped = {}
    with open(rows_file, "a") as f:
        for k in names:
            if k in done:
                continue
            r = tabs[args.gpu][k]
            try:
                path = export(k, int(r["infer_img_size"]), args.onnx)
                ms, kind = forward_ms(path, int(r["infer_batch_size"]), gpu, model)
            except Exception as e:  # noqa: BLE001  a model the exporter refuses: reported
                skipped[k] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                continue
            done[k] = dict(model=k, kind=kind, batch=int(r["infer_batch_size"]),
                           image_size=int(r["infer_img_size"]), priced_ms=ms)
            f.write(json.dumps(done[k]) + "\n")  # timm's measured time stays in its table
            f.flush()
            print(k, f"{ms / float(r['infer_step_time']):.3f}", flush=True)
    rows = [dict(done[k], measured_ms=float(tabs[args.gpu][k]["infer_step_time"]))
            for k in names if k in done]
    result = dict(gpu=gpu.name, sampled=len(names), summary=summary(rows), skipped=skipped,
                  source="timm's results tables (huggingface/pytorch-image-models, Apache-2.0)")
    (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
