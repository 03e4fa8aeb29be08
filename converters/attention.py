"""Attention in an operator sequence: the scores of a batched MatMul, a Softmax over them and a
MatMul of the probabilities with the values, whatever elementwise work sits between (scale,
mask, NaN guards, dropout, casts). Exporters decompose `scaled_dot_product_attention` so;
PyTorch itself runs one fused kernel (FlashAttention, memory-efficient attention) for it on
GPUs at half precision, without the S x S tensors the decomposition shows.

Host-side numpy over `OperatorSequence.edges`; nothing here is jitted.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from converters.sequence import OperatorSequence

_BETWEEN = {"Add", "Sub", "Mul", "Div", "Where", "IsNaN", "Cast", "Dropout", "Neg", "Max"}
_HOPS = 4  # elementwise operators between the scores' MatMul and the Softmax, or after it


class Block(NamedTuple):
    scores: int  # the MatMul making Q K^T
    softmax: int
    output: int  # the MatMul of the probabilities with V


def _walk(start: int, step: dict[int, list[int]], names: np.ndarray) -> int | None:
    """The first MatMul within `_HOPS` elementwise operators of `start` along `step`."""
    frontier = [start]
    for _ in range(_HOPS):
        nxt = []
        for i in frontier:
            for j in step.get(i, []):
                if names[j] == "MatMul":
                    return j
                if names[j] in _BETWEEN:
                    nxt.append(j)
        frontier = nxt
    return None


def attention_blocks(seq: OperatorSequence) -> list[Block]:
    """Every Softmax with a MatMul upstream and one downstream, in graph order."""
    names = seq.op_names
    preds: dict[int, list[int]] = {}
    succs: dict[int, list[int]] = {}
    for src, dst in seq.edges.tolist():
        preds.setdefault(dst, []).append(src)
        succs.setdefault(src, []).append(dst)
    blocks = []
    for i in np.flatnonzero(names == "Softmax").tolist():
        scores, output = _walk(i, preds, names), _walk(i, succs, names)
        if scores is not None and output is not None:
            blocks.append(Block(scores, i, output))
    return blocks
