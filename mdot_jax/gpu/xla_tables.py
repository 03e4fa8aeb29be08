"""XLA's measured GEMM tables, read where they lie: training rows of the kernel model and of
the tensor-core constants (`tensor_cores`).

`matmul.csv` (in `../shared/datasets/xla-h100-tables`; OpenXLA, Apache-2.0,
`xla/service/gpu/model/matmul_interpolator_data.h` at upstream commit b2766086): the throughput
of one batched dot `[b, m, k] x [b, k, n]` on an sm_90 GPU, b in {1, 2, 4} and m, n, k in
{256, ..., 4096}, in bf16 and in f32 (a dot without a precision config: TF32 on Hopper and
Blackwell), the median of 5 traced kernel times. The table does not name the H100 variant; it
is read as the catalog's SXM part. Each row's `gpu_key` (XLA's key, `GPUS`; sm_90 where the
column is absent) names its GPU: XLA's source measures a B200 too (`sm_100_B200`), whose rows a
table of these columns may hold (`benchmarks/bench_blackwell_gemms.py`). Never copied into this
repository.
"""

from __future__ import annotations

import csv
from pathlib import Path

from mdot_jax.gpu import catalog as gpus

SOURCE = ("XLA's H100 GEMM table (OpenXLA, Apache-2.0: xla/service/gpu/model/"
          "matmul_interpolator_data.h, commit b2766086), read in place from "
          "../shared/datasets/xla-h100-tables")
GPUS = {"sm_90": "nvidia-h100-sxm", "sm_100_B200": "nvidia-b200-sxm"}  # XLA's key -> ours
GPU_NAME = GPUS["sm_90"]  # the shared folder's table's
# the table's dtype -> (the catalog's peak, bytes per element)
DTYPES = {"bf16xbf16->bf16": ("bf16", 2), "f32xf32->f32": ("tf32", 4)}


def matmuls(root: str | Path, with_peaks: bool = False) -> tuple:
    """(ops, dims (B, M, N, K), the GPU as each kernel sees it, measured ms) of every row, and
    `with_peaks` the spec-sheet peak each row runs at (bf16, tf32)."""
    path = Path(root) / "matmul.csv"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no XLA GEMM table there")
    ops, dims, seen, ms, peaks = [], [], [], [], []
    with open(path) as f:
        for line, r in enumerate(csv.DictReader(f), start=2):
            if r.get("dtype") not in DTYPES:
                raise ValueError(f"{path}:{line}: dtype {r.get('dtype')!r}, not one of "
                                 f"{list(DTYPES)}")
            precision, width = DTYPES[r["dtype"]]
            if (key := r.get("gpu_key") or "sm_90") not in GPUS:
                raise ValueError(f"{path}:{line}: gpu_key {key!r}, not one of {list(GPUS)}")
            gpu = gpus.find(GPUS[key])
            try:
                b, m, n, k = (int(r[c]) for c in ("b", "m", "n", "k"))
                flops_per_s = float(r["flops_per_s"])
            except (TypeError, ValueError):
                raise ValueError(f"{path}:{line}: b, m, n, k must be integers and flops_per_s "
                                 "a number") from None
            if min(b, m, n, k) < 1 or not flops_per_s > 0:
                raise ValueError(f"{path}:{line}: b, m, n, k and flops_per_s must be positive")
            ops.append("bmm")
            dims.append((b, m, n, k))
            seen.append(gpus.as_seen(gpu, gpu.tflops[precision], width))
            ms.append(2e3 * b * m * n * k / flops_per_s)
            peaks.append(precision)
    return (ops, dims, seen, ms, peaks) if with_peaks else (ops, dims, seen, ms)
