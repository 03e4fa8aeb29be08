"""A Blackwell GPU's GEMMs at the share of its peak the B200's measured GEMMs reach.

    python benchmarks/bench_blackwell_gemms.py --table B200_FOLDER \
        --out benchmarks/results/blackwell-gemms [--ship]

Tensor-core GEMMs are priced at the shares XLA's measured H100 GEMMs reach (`gpu.tensor_cores`),
on every GPU. XLA's source ships a B200 table beside the H100's
(`xla/service/gpu/model/matmul_interpolator_data.h`, OpenXLA, Apache-2.0, key `sm_100_B200`;
read with the search tool's `read_file` in ROCm/xla at commit 63ce2981, never copied into this
repository): `B200_FOLDER/matmul.csv` holds its rows in the shared H100 table's columns
(`gpu_key,b,m,n,k,dtype,flops_per_s`), those of b = 1 and m in {256, 1,024, 2,048, 4,096} (100
shapes, bf16 and f32), transcribed from those pages. The same form is fitted on them
(`TensorCoreGemms.fit`), and `--ship` gives the shipped step model the B200's constants
(`tensor_core_gemms_of`), which `peaks.nearest_gemms` applies to the B200 and the GPUs of its
architecture (B300, GB200); other GPUs keep the H100's.

No B200 step is measured anywhere we can read, so nothing confirms the change on steps; what is
reported instead (`--out`): the constants; how the H100's constants price the B200's rows
against how they price the H100's own rows of the same shapes (that the two GPUs differ, and
by how much); the H100 fitted on those shapes alone against its whole table (what fitting one
batch size and four sizes of m costs); and a few steps on the B200 priced both ways.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

H100_TABLE = "../shared/datasets/xla-h100-tables"
SOURCE = ("XLA's B200 GEMM table (OpenXLA, Apache-2.0: xla/service/gpu/model/"
          "matmul_interpolator_data.h, key sm_100_B200, ROCm/xla at 63ce2981): b = 1, m in "
          "{256, 1024, 2048, 4096}, transcribed (benchmarks/bench_blackwell_gemms.py)")
STEPS = (("gpt2", dict(seq_len=1024, batch_size=8)),
         ("llama-3.1-8b", dict(seq_len=4096, batch_size=1)))


def ratios(gemms, table: str | Path) -> dict:
    """Per arithmetic, `gemms`' prices of `table`'s rows over the measured: median, MAPE, and the
    median of the large ones (2 m n k >= 2 x 2,048^3 FLOPs)."""
    from mdot_jax.gpu import xla_tables
    from mdot_jax.gpu.tensor_cores import ARITHMETIC

    ops, dims, seen, ms, peaks = xla_tables.matmuls(table, with_peaks=True)
    out = {}
    for peak in sorted(set(peaks)):
        at = [i for i, p in enumerate(peaks) if p == peak]
        c = gemms.constants[ARITHMETIC[peak]]
        r = np.array([c.ms(ops[i], dims[i], seen[i]) / ms[i] for i in at])
        large = np.array([np.prod(dims[i][1:]) >= 2048 ** 3 for i in at])
        out[peak] = dict(rows=len(at), median=float(np.median(r)),
                         mape=float(100 * np.mean(np.abs(r - 1))),
                         large_median=float(np.median(r[large])))
    return out


def same_shapes(table: str | Path, into: Path) -> Path:
    """The rows of the H100's `table` of the B200 table's shapes (b = 1, m in its four)."""
    with open(Path(table) / "matmul.csv") as f, open(into / "matmul.csv", "w", newline="") as g:
        rows = csv.DictReader(f)
        w = csv.DictWriter(g, rows.fieldnames or [])
        w.writeheader()
        w.writerows(r for r in rows if r["b"] == "1" and r["m"] in ("256", "1024", "2048", "4096"))
    return into


def ship(gemms) -> None:
    """The shipped step model's meta gains the GPU's constants (and its command says how)."""
    from mdot_jax.storage.checkpoint import amend_step_model
    from mdot_jax.storage.shipped import STEP_MODEL_DIR

    def change(meta: dict) -> None:
        meta.setdefault("tensor_core_gemms_of", {})[gemms.gpu] = gemms.to_json()
        meta["command"] = meta["command"].split("; Blackwell GEMMs:")[0] + (
            "; Blackwell GEMMs: python benchmarks/bench_blackwell_gemms.py --table B200_FOLDER "
            "--ship")

    amend_step_model(STEP_MODEL_DIR, change)


def main(argv: list[str] | None = None) -> int:
    from mdot_jax import TrainingJob, predict
    from mdot_jax.gpu.spec_sheet import load_step_model
    from mdot_jax.gpu.tensor_cores import TensorCoreGemms
    from mdot_jax.storage.checkpoint import step_model_copy
    from mdot_jax.storage.shipped import STEP_MODEL_DIR

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--table", required=True, help="a folder with the B200's matmul.csv")
    p.add_argument("--h100", default=H100_TABLE, help="the shared H100 table's folder")
    p.add_argument("--out", required=True)
    p.add_argument("--ship", action="store_true", help="write the constants into the shipped "
                   "step model")
    args = p.parse_args(argv)
    b200, h100 = TensorCoreGemms.fit(args.table, SOURCE), TensorCoreGemms.fit(args.h100)
    with tempfile.TemporaryDirectory() as d:
        shapes = same_shapes(args.h100, Path(d))
        h100_shapes = TensorCoreGemms.fit(shapes)
        report = dict(
            constants={g.gpu + k: g.to_json()["constants"] for g, k in (
                (b200, ""), (h100, ""), (h100_shapes, " (the B200's shapes alone)"))},
            h100_constants_on_b200_rows=ratios(h100, args.table),
            h100_constants_on_h100_rows_of_those_shapes=ratios(h100, shapes),
            b200_constants_on_b200_rows=ratios(b200, args.table))
    with tempfile.TemporaryDirectory() as d:  # the shipped step model with the constants
        candidate = step_model_copy(STEP_MODEL_DIR, Path(d) / "candidate", tensor_core_gemms_of={
            **load_step_model(None).info.get("tensor_core_gemms_of", {}),
            b200.gpu: b200.to_json()})
        steps = {name: {how: predict(TrainingJob(
            model=name, device=b200.gpu, precision="amp-bf16", optimizer="adamw",
            checkpoint=checkpoint, **shape)).iteration_ms
            for how, checkpoint in (("shipped", None), ("candidate", str(candidate)))}
            for name, shape in STEPS}
    if args.ship:
        ship(b200)
    report["steps_ms"] = steps
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
