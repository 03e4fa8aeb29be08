"""What kernel each operator of a sequence runs, and the measured operator that prices it
(`classify`): the rules of `gpu.spec_sheet`'s module docstring, per operator type.

Kinds: "conv", "linear", "bmm" (GEMMs), the row-wise kinds (softmax, normalisations, losses),
"elementwise", "dropout", "embedding", "free" (views: nothing runs) and "other" (priced as a
copy of its larger tensor, warned about). Dims as `gpu.gpu_ops` takes them.
"""

from __future__ import annotations

import numpy as np

from converters import OperatorSequence
from converters.kept import KEPT
from converters.sequence import CONFIG_FIELDS, LOAD_FIELDS
from converters.traits import LOSSES, TRAITS, of_kind

_GEMM = {t: tr.kernel for t, tr in TRAITS.items() if tr.kernel in ("gemm", "conv")}
_ROWWISE, _BINARY, _UNARY = of_kind("rowwise"), of_kind("binary"), of_kind("unary")
_COPIES, _FREE, _STREAMS = set(of_kind("copy")), set(of_kind("free")), of_kind("stream")
_C = {name: i for i, name in enumerate(CONFIG_FIELDS)}
_L = {name: i for i, name in enumerate(LOAD_FIELDS)}


def classes_field(c: np.ndarray) -> str:
    """The config field holding a loss's classes (its input's axis 1)."""
    return f"in_d{min(5 - int(c[_C['in_rank']]), 3)}"


def _rowwise(op_type: str, c: np.ndarray) -> tuple[int, int]:
    """(rows, row length) of a softmax, loss or normalisation kernel."""
    n, rank = int(c[_C["out_numel"]]), int(c[_C["out_rank"]])
    if op_type in LOSSES:  # [N, C, ...] scores, C at axis 1: rows of C
        n, classes = int(c[_C["in_numel"]]), int(c[_C[classes_field(c)]])
        return max(n // max(classes, 1), 1), max(classes, 1)
    if op_type in ("BatchNormalization", "InstanceNormalization") and rank >= 2:
        d = [int(c[_C[f"out_d{i}"]]) for i in range(4)]
        rows = d[3] if rank == 2 else d[4 - rank] * d[5 - rank]  # channels (x batch)
    elif op_type == "GroupNormalization":
        rows = int(c[_C[f"out_d{4 - rank}"]] * c[_C["groups"]]) if rank >= 2 else 1
    else:
        rows = n // max(int(c[_C["out_d3"]]), 1)
    rows = max(rows, 1)
    return rows, max(n // rows, 1)


def classified(seq: OperatorSequence) -> list[tuple[str, str, tuple]]:
    """`classify` of each operator of `seq`, kept while `seq` is (a plan prices it often)."""
    return KEPT.get(("classified", seq), lambda: [
        classify(n, c, ld) for n, c, ld in zip(seq.op_names, seq.config, seq.load)])


def classify(op_type: str, c: np.ndarray, load: np.ndarray) -> tuple[str, str, tuple]:
    """(node kind, measured operator, dims) of one operator; kind "free" costs nothing,
    "other" is priced as a copy and warned about. An empty output (a shifted window's slice
    of none of the frames) is free: PyTorch launches no kernel for it."""
    if int(c[_C["out_numel"]]) == 0:
        return "free", "", ()
    out_n = int(c[_C["out_numel"]])
    cls = _GEMM.get(op_type)
    if cls == "conv":  # groups fold into the output channels: the same FLOPs and bytes
        g = int(c[_C["groups"]])
        return "conv", "conv", (1, int(c[_C["mm_m"]]), g * int(c[_C["mm_n"]]),
                                int(c[_C["mm_k"]]), int(c[_C["in_numel"]]))
    if cls == "gemm":
        b, m, k, n = (max(int(c[_C[f]]), 1) for f in ("mm_batch", "mm_m", "mm_k", "mm_n"))
        if op_type == "Einsum":  # no GEMM shape recorded: a cube of its FLOPs
            b, m = 1, max(round((load[_L["fwd_flops"]] / 2) ** (1 / 3)), 1)
            k = n = m
        # one [K, N] matrix shared by the whole batch (a weight, however it was transposed
        # or cast on the way): a linear layer over batch x M rows
        second = load[_L["bytes_read"]] - c[_C["in_numel"]] * c[_C["elem_bytes"]]
        if op_type == "Gemm" or c[_C["n_param_inputs"]] > 0 or second <= 1.5 * k * n * \
                c[_C["elem_bytes"]]:
            return "linear", "linear", (1, b * m, n, k)
        return "bmm", "bmm", (b, m, n, k)
    if op_type in _ROWWISE:
        return _ROWWISE[op_type], _ROWWISE[op_type], _rowwise(op_type, c)
    last = max(min(int(c[_C["out_d3"]]), out_n), 1)  # a tensor sharded below its last dim
    rows = (max(out_n // last, 1), last)  # (sequence parallelism's cut of [1, S] token ids)
    if op_type in _BINARY:  # both operands full size, or one broadcast (a bias, a scalar)
        full = load[_L["bytes_read"]] >= 1.9 * out_n * c[_C["elem_bytes"]]
        return "elementwise", _BINARY[op_type] + ("" if full else "u"), rows
    if op_type in _UNARY:
        return "elementwise", _UNARY[op_type], rows
    if op_type in _FREE:
        return "free", "", ()
    if op_type == "Dropout":
        return "dropout", "mul", rows
    if op_type == "Gather" and c[_C["n_param_inputs"]] > 0:
        return "embedding", "addu", rows
    if op_type in _COPIES:
        return "elementwise", "addu", rows
    if op_type in _STREAMS:  # its bytes, as a full-size binary op moves 3 elements an output
        moved = (load[_L["bytes_read"]] + load[_L["bytes_written"]]) / c[_C["elem_bytes"]]
        return "elementwise", _STREAMS[op_type], (1, max(round(moved / 3), 1))
    return "other", "addu", (1, max(out_n, int(c[_C["in_numel"]]), 1))
