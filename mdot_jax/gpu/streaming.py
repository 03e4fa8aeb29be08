"""Memory-bound kernels (elementwise, normalisations, softmax) at a measured share of the
bandwidth, in the form of the tensor-core GEMMs (`tensor_cores.Constants`):

    t = fixed + max(FLOPs / (share_c peak), bytes / (share_m bandwidth))

per class (`elementwise`; `rowwise`: softmax and layer norm), the GPU seen at the kernel's
element width (`catalog.as_seen`), fitted on a lent GPU's kernel sweep
(`measure.kernel_sweep`: single launches, so `fixed` holds the host's issue time). Behind a
host that issues kernels (`spec_sheet.launch_bound`) a kernel's GPU part is its time less
`fixed`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mdot_jax.gpu import catalog
from mdot_jax.gpu.catalog import GPU
from mdot_jax.gpu.neusight import CONV, GEMMS, ROWWISE
from mdot_jax.gpu.tensor_cores import Constants, _fit

# the sweep's memory-bound kinds -> the operator names of `gpu.neusight.OPS`
SWEEP_OPS = {"add": "add", "mul": "mul", "gelu": "gelu", "layer_norm": "ln", "softmax": "softmax"}
WIDTH = {"fp32": 4, "fp16": 2, "bf16": 2}


def op_class(op: str) -> str | None:
    """`elementwise`, `rowwise`, or None for a GEMM or convolution (not memory-bound)."""
    return None if op in GEMMS or op == CONV else "rowwise" if op in ROWWISE else "elementwise"


def fit(rows: Sequence[dict]) -> dict:
    """Per class, the constants fitted on a sweep's measured memory-bound `rows` (kind,
    precision, dims, device, ms); JSON as a step model's `streaming_kernels` holds them."""
    by: dict[str, list] = {}
    for r in rows:
        op = SWEEP_OPS.get(r["kind"])
        if op is None or r["precision"] not in WIDTH or not r.get("ms"):
            continue
        gpu = catalog.find(r["device"])
        seen = catalog.as_seen(gpu, gpu.tflops["fp32"], WIDTH[r["precision"]])
        by.setdefault(op_class(op) or "", []).append((op, tuple(r["dims"]), seen, float(r["ms"])))
    if not by:
        raise ValueError("no measured memory-bound kernels (add, mul, gelu, layer_norm, "
                         "softmax) in the sweep")
    return {c: vars(_fit(*map(list, zip(*v)))) for c, v in sorted(by.items())}


def fit_sweep_rows(rows: Sequence[dict]) -> dict:
    """A step model's `streaming_kernels` (less its `source`): the constants fitted on a
    kernel sweep's rows (`measure.kernel_sweep`) and the GPU they ran on."""
    return dict(constants=fit(rows), gpu=catalog.find(rows[0]["device"]).name)


def ms(constants: dict, ops: Sequence[str], dims: Sequence[Sequence[int]],
       seen: Sequence[GPU], streamed: bool) -> np.ndarray:
    """`[N]` ms of each memory-bound kernel (NaN where `ops` holds another), its GPU part
    alone where `streamed`."""
    out = np.full(len(ops), np.nan)
    for i, (o, d, g) in enumerate(zip(ops, dims, seen)):
        c = op_class(o)
        if c in constants:
            k = Constants(**constants[c])
            out[i] = k.ms(o, d, g) - (k.fixed_ms if streamed else 0.0)
    return out
