"""A graph's tensors as the converter reads them: shape (None unless concrete), element type,
element count and bytes."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

import onnx

FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
                         onnx.TensorProto.BFLOAT16})  # the element types of weights
TOKEN_TYPES = frozenset({onnx.TensorProto.INT32, onnx.TensorProto.INT64})  # of token ids

_ELEM_BYTES = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8,
               14: 8, 15: 16, 16: 2}


def token_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """The graph's inputs of token ids: rank 2 ([batch, tokens]), of an integer type."""
    return [i for i in graph.input if len(i.type.tensor_type.shape.dim) == 2
            and i.type.tensor_type.elem_type in TOKEN_TYPES]


class _Tensor(NamedTuple):
    shape: tuple[int, ...] | None  # None when not concrete
    elem_type: int
    numel: int
    nbytes: int


def _tensor(shape, elem_type) -> _Tensor:
    if shape is None:
        return _Tensor(None, elem_type, 0, 0)
    n = math.prod(shape)
    return _Tensor(shape, elem_type, n, n * _ELEM_BYTES.get(elem_type, 4))


def _tensor_types(graph: onnx.GraphProto) -> dict[str, _Tensor]:
    """Tensor name -> shape (None unless concrete), element type, numel and bytes."""
    out: dict[str, _Tensor] = {}
    for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
        t = vi.type.tensor_type
        shape = None
        if t.HasField("shape"):
            shape = tuple(d.dim_value for d in t.shape.dim)
            # a 0 is either a symbolic / unknown dim or a real empty dim: check (rare path)
            if not all(shape) and not all(d.HasField("dim_value") for d in t.shape.dim):
                shape = None
        out[vi.name] = _tensor(shape, t.elem_type)
    for init in graph.initializer:
        out[init.name] = _tensor(tuple(init.dims), init.data_type)
    return out


_NO_SHAPE = _Tensor(None, 0, 0, 0)


HALF_TYPES: dict[int, str] = {onnx.TensorProto.BFLOAT16: "bf16", onnx.TensorProto.FLOAT16: "fp16"}


def half_of(types: dict[str, _Tensor], params: Iterable[str]) -> str | None:
    """"bf16" or "fp16" where most of the parameters' elements are held in it (a model exported
    in a half type), else None."""
    held: dict[int, int] = {}
    for t in params:
        if t in types:
            held[types[t].elem_type] = held.get(types[t].elem_type, 0) + types[t].numel
    return HALF_TYPES.get(max(held, key=held.__getitem__)) if held else None
