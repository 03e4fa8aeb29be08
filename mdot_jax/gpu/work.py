"""The work of one kernel from its shapes: FLOPs, bytes, parallel units (tiles or thread
blocks), and its time at the roofline. Dims: GEMMs (B, M, N, K), convolutions as implicit
GEMMs (G, M, N, K, X: `neusight.conv_dims`), the others (B, H); bytes are fp32's."""

from __future__ import annotations

import math
from collections.abc import Sequence

from mdot_jax.gpu.catalog import GPU
from mdot_jax.gpu.neusight import CONV, GEMMS, OPS, ROWWISE

TILE = 128  # the GEMM output tile side the waves are counted in
BLOCK = 512  # elements per thread block of an elementwise kernel (128 threads x 4)
RESIDENT = 8  # thread blocks of an elementwise kernel resident on one SM
FLOPS_PER_ELEMENT = dict(add=1, mul=1, div=1, pow=10, addu=1, mulu=1, divu=1, powu=10, relu=1,
                         gelu=20, tanh=10, softmax=5, ln=8)

def work(op: str, dims: Sequence[int]) -> tuple[float, float, float, float, float]:
    """(FLOPs, bytes moved, parallel units of work, tile efficiency, K) of one operator."""
    if op == CONV:  # G groups of [M, K] x [K, N] over X input elements
        g, m, n, k, x = (float(d) for d in dims)
        tiles = math.ceil(m / TILE) * math.ceil(n / TILE) * g
        used = m * n / (math.ceil(m / TILE) * TILE * math.ceil(n / TILE) * TILE)
        return 2 * g * m * n * k, 4 * (x + g * n * k + g * m * n), tiles, used, k
    if op in GEMMS:
        b, m, n, k = (float(d) for d in dims)
        rows = b * m if op == "linear" else m
        tiles = math.ceil(rows / TILE) * math.ceil(n / TILE) * (1 if op == "linear" else b)
        weights = k * n if op == "linear" else b * k * n
        used = rows * n / (math.ceil(rows / TILE) * TILE * math.ceil(n / TILE) * TILE)
        return 2 * b * m * n * k, 4 * (b * m * k + weights + b * m * n), tiles, used, k
    if op not in OPS:
        raise ValueError(f"unknown operator {op!r}; known: {list(OPS)}")
    b, h = (float(d) for d in dims)
    n = b * h
    reads = 2 if op in ("add", "mul", "div", "pow") else 1  # the others: one tensor read
    units = b if op in ROWWISE else math.ceil(n / BLOCK)
    return FLOPS_PER_ELEMENT[op] * n, 4 * n * (reads + 1), units, 1.0, 1.0


def roofline_ms(op: str, dims: Sequence[int], gpu: GPU) -> float:
    """The time at the roofline: max(FLOPs / peak fp32, bytes / bandwidth), ms."""
    flops, moved, *_ = work(op, dims)
    return 1e3 * max(flops / (gpu.tflops["fp32"] * 1e12), moved / (gpu.memory_gbs * 1e9))


def waves(op: str, units: float, gpu: GPU) -> float:
    """Waves of `units` (`work`'s tiles or thread blocks) over the GPU's SMs: one tile a
    wave per SM for GEMMs and convolutions, `RESIDENT` thread blocks for the others."""
    return units / (gpu.sms * (1 if op in GEMMS or op == CONV else RESIDENT))
