"""What PyTorch's autocast (`amp-*` precisions) does to a training step's tensors: which
outputs stay fp32, and the cast kernels it adds (`gpu.spec_sheet` prices both).

- GEMMs and convolutions (autocast's lower-precision list) write the half type; softmax and
  the normalisations but batch norm (its fp32 list) write fp32; any other float operator
  writes fp32 where it reads another operator's fp32 output, or no float output of another
  operator at all (it reads only graph inputs and weights, which are fp32), the half type
  otherwise (type promotion; a weight or constant beside a half tensor does not promote it, as
  a bias inside a linear layer or a 0-d scale does not). `fp32_outputs`.
- casts: each weight a GEMM or convolution reads, cast to the half type in the forward and its
  gradient back; each fp32 tensor it reads (by default the outputs of autocast's fp32
  operators; given `fp32`, every fp32 tensor), cast again, forward and backward. `casts`.
"""

from __future__ import annotations

import numpy as np

from converters import OperatorSequence
from converters.sequence import CONFIG_FIELDS, LOAD_FIELDS
from converters.traits import TRAITS, of_kind
from mdot_jax.gpu.catalog import GPU

FP32_OPS = set(of_kind("rowwise")) - {"BatchNormalization"}
HALF_OPS = {t for t, tr in TRAITS.items() if tr.kernel in ("gemm", "conv")}
_C = {name: i for i, name in enumerate(CONFIG_FIELDS)}
_L = {name: i for i, name in enumerate(LOAD_FIELDS)}


def producers(seq: OperatorSequence) -> dict[int, list[int]]:
    """node -> the nodes whose outputs it reads."""
    out: dict[int, list[int]] = {}
    for src, dst in seq.edges.tolist():
        out.setdefault(dst, []).append(src)
    return out


def fp32_outputs(seq: OperatorSequence) -> np.ndarray:
    """`[N]` bool: whether each node writes fp32 under autocast (the module docstring's rule;
    a node whose exported output is not a 4-byte float, such as a mask, is never fp32)."""
    reads, width = producers(seq), seq.config[:, _C["elem_bytes"]]
    out = np.zeros(seq.num_ops, bool)
    for i, name in enumerate(seq.op_names.tolist()):  # topological: producers come first
        if name in HALF_OPS or width[i] != 4:
            continue
        floats = [j for j in reads.get(i, []) if width[j] == 4]
        out[i] = name in FP32_OPS or not floats or any(out[j] for j in floats)
    return out


def casts(seq: OperatorSequence, kinds: list[str], skip: set[int], gpu: GPU,
          half_weights: bool, fp32: np.ndarray | None = None
          ) -> list[tuple[int, str, str, tuple, GPU, float]]:
    """The cast kernels autocast adds, as `spec_sheet.price` lists work: (node, phase,
    operator, dims, GPU, 1.0); with `half_weights`, no weight's."""
    weights = 0 if half_weights else 1
    reads = producers(seq)
    out = []
    for i, kind in enumerate(kinds):
        if kind not in ("linear", "bmm", "conv") or i in skip:
            continue
        sizes = [weights * int(seq.load[i, _L["params"]])]
        todo, seen = list(reads.get(i, [])), set()
        while todo:  # through views to the tensors it reads
            j = todo.pop()
            if j in seen:
                continue
            seen.add(j)
            if kinds[j] == "free":  # a view, of a weight perhaps (transposed on the way)
                sizes.append(weights * int(seq.load[j, _L["params"]]))
                todo.extend(reads.get(j, []))
            elif (fp32[j] if fp32 is not None else seq.op_names[j] in FP32_OPS) \
                    and j not in skip:
                sizes.append(int(seq.config[j, _C["out_numel"]]))
        out += [(i, phase, "addu", (1, n), gpu, 1.0) for n in sizes if n > 0
                for phase in ("fw", "bw")]
    return out
