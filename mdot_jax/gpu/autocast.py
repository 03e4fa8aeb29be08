"""The cast kernels PyTorch's autocast (`amp-*` precisions) adds to a training step
(`gpu.spec_sheet` prices them): each weight a GEMM or convolution reads, cast to the half type
in the forward and its gradient back; each fp32 output of autocast's fp32 operators (softmax
and the normalisations but batch norm) a GEMM or convolution reads, cast again, forward and
backward. Frozen weights held in the half type need none; QLoRA's 4-bit ones are dequantised
for each GEMM instead (`dequantised`).
"""

from __future__ import annotations

import numpy as np

from converters import OperatorSequence
from converters.sequence import CONFIG_FIELDS
from converters.traits import of_kind
from mdot_jax.autograd import NF4_BYTES, Backward, frozen_nodes, quantized
from mdot_jax.gpu.catalog import GPU
from mdot_jax.serving.memory import HALF

FP32_OPS = set(of_kind("rowwise")) - {"BatchNormalization"}
HALF_TYPE = {"amp-fp16": "fp16", "amp-bf16": "bf16", "fp8": "bf16"}  # autocast's, a precision
_C = {name: i for i, name in enumerate(CONFIG_FIELDS)}


def casts(seq: OperatorSequence, kinds: list[str], skip: set[int], gpu: GPU,
          half_weights: bool, grads: Backward, precision: str, activations: bool = True
          ) -> list[tuple[int, str, str, tuple, GPU, float]]:
    """The cast kernels autocast at `precision` adds, as `spec_sheet.price` lists work: (node,
    phase, operator, dims, GPU, 1.0); with `half_weights`, no weight's; `grads`: the backward
    autograd runs (`autograd.backward`), a frozen weight's gradient never cast back; without
    `activations`, no activation's (a compiled step stores them cast: `gpu.compiled`)."""
    weights = 0 if half_weights else 1
    reads, _ = seq.neighbours()  # node -> the nodes whose outputs it reads
    out, names, held = [], seq.op_names, seq.column("params")
    if seq.meta.get("frozen_weights") in ("nf4", HALF_TYPE.get(precision)):  # frozen weights
        held = np.where(frozen_nodes(seq), 0.0, held)  # in (or dequantised to) the half type
        # autocast computes in: it casts none of them (fp16 ones under bf16 autocast it does)
    for i, kind in enumerate(kinds):
        if kind not in ("linear", "bmm", "conv") or i in skip:
            continue
        both = ("fw", "bw") if grads.runs[i] else ("fw",)  # a weight's gradient: if trained
        sizes = [(weights * int(held[i]), both if grads.weights[i] else ("fw",))]
        todo, seen = list(reads.get(i, [])), set()
        while todo:  # through views to the tensors it reads
            j = todo.pop()
            if j in seen:
                continue
            seen.add(j)
            if kinds[j] == "free":  # a view, of a weight perhaps (transposed on the way)
                sizes.append((weights * int(held[j]), both if grads.weights[j] else ("fw",)))
                todo.extend(reads.get(j, []))
            elif names[j] in FP32_OPS and j not in skip and activations:
                sizes.append((int(seq.config[j, _C["out_numel"]]), both))
        out += [(i, phase, "addu", (1, n), gpu, 1.0) for n, phases in sizes if n > 0
                for phase in phases]
    return out


def dequantised(seq: OperatorSequence, grads: Backward, gpu: GPU, precision: str
                ) -> list[tuple[int, str, str, tuple, GPU, float]]:
    """QLoRA's kernels (`frozen_weights` nf4, `autograd.quantized`): each 4-bit weight
    dequantised to the compute type for its GEMM in the forward, and again for its data
    gradient in the backward; a unary kernel over as many elements as move its bytes (half a
    byte read an element, the compute type's written)."""
    width = 2.0 if precision in HALF else 4.0
    return [(i, phase, "addu", (1, round(n * (NF4_BYTES + width) / (2 * width))), gpu, 1.0)
            for i, (_, n) in quantized(seq).items()
            for phase in (("fw", "bw") if grads.data[i] else ("fw",))]


def fp8_casts(linears: list[tuple[int, tuple]], gpu: GPU
              ) -> list[tuple[int, str, str, tuple, GPU, float]]:
    """The kernels FP8 training adds around each linear layer (node, its GEMM's (1, M, N, K)):
    its input and weight in the forward and its output's gradient in the backward, each
    scaled by its absolute maximum (a reduction) and cast to FP8 with a transposed copy for the
    other GEMM (one kernel), as Transformer Engine and torchao's float8 do per tensor."""
    out = []
    for i, (_, m, n, k) in linears:
        for phase, size in (("fw", m * k), ("fw", k * n), ("bw", m * n)):
            out += [(i, phase, "addu", (1, int(size)), gpu, 1.0)] * 2
    return out
