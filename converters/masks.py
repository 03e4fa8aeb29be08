"""Attention masks as the converter sees them, for `converters.attention`: constants that mask
nothing (a fill), the tensors of a mask that orders queries against keys (a causal or a
sliding-window one), as opposed to one made of a batch's padding alone (an encoder's, expanded
to queries x keys by transformers), which attends every key, and the tensors made of the batch
itself (an attention mask given as an input): a mask PyTorch's attention is handed as a tensor.
For the loader, the float initializers an export folded a mask into, which are no weights
(`folded`). Host-side numpy over the graph."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from converters.fusion import constants
from converters.tensors import _NO_SHAPE, FLOAT_TYPES, _Tensor

MASK_MAX_ELEMENTS = 1 << 22  # the largest folded mask `patterns` reads (a 2,048-token square)
MASK_FILL = -1e4  # at most this (down to -inf, or the float's lowest): a key masked, never a weight
FILLS_KEY = "mdot.fills"  # model metadata: the folded masks of one value (`folded`)
PADDING_KEY = "mdot.padding"  # model metadata: folded masks of padding, keys alone (`folded`)
# comparisons that, as wide as the scores, order queries against keys; the operators a mask is
# built and applied with
COMPARISONS = {"Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Trilu"}
MASK_OPS = COMPARISONS | {"And", "Or", "Not", "Xor", "Cast", "Expand", "Reshape", "Unsqueeze",
                          "Squeeze", "Flatten", "Transpose", "Slice", "Where", "Mul", "Add", "Sub",
                          "Neg", "Concat", "Tile", "Gather", "Equal", "Min", "Max", "BitwiseAnd",
                          "BitwiseOr", "BitwiseNot"}
# and what picks a batch's mask out by computed indices (whose indices order nothing)
BATCH_OPS = MASK_OPS | {"GatherND", "GatherElements"}


def listed(model: onnx.ModelProto, key: str) -> set[str]:
    """The tensors the model metadata `key` names (the loader's `FILLS_KEY`, `PADDING_KEY`)."""
    return set(next((p.value for p in model.metadata_props if p.key == key), "").split(",")) - {""}


def fills(model: onnx.ModelProto) -> set[str]:
    """Float tensors of more than one element that hold one value throughout (a zero position
    bias that `torch.zeros` made: a ConstantOfShape's output, or the initializer folding made
    of it; a folded mask the loader found so, `FILLS_KEY`): no mask, whatever their shape."""
    graph = model.graph
    out = listed(model, FILLS_KEY)
    for init in graph.initializer:
        if init.data_type in FLOAT_TYPES and int(np.prod(init.dims)) > 1 and (
                init.raw_data or init.float_data or init.double_data):
            v = numpy_helper.to_array(init)
            if v.min() == v.max():
                out.add(init.name)
    return out | {n.output[0] for n in graph.node if n.op_type == "ConstantOfShape"}


def folded(init: onnx.TensorProto, base: Path | None = None) -> str:
    """What a float initializer is: "mask", "padding", "fill" or "" (a weight). torch.export
    folds SDPA's mask into a float initializer [B, 1, S, S]: of 0 and the float's lowest value
    where keys are masked (`MASK_FILL` in its first S x S: a "mask" where that varies over both
    queries and keys, causal or windowed, else "padding", keys masked alike for every query),
    of 0 alone where the batch masks nothing (a "fill": one value throughout [..., 1, S, S]);
    no weight holds either. Only tensors whose last two dims are equal are read, their first
    S x S alone; values stored beside the model (`base`, its folder) where the rank is >= 3
    (square weights are rank 2)."""
    dims = list(init.dims)
    if len(dims) < 2 or dims[-1] != dims[-2] or dims[-1] < 2 or init.data_type not in FLOAT_TYPES:
        return ""
    n = min(dims[-1] * dims[-2], MASK_MAX_ELEMENTS)
    dtype = helper.tensor_dtype_to_np_dtype(init.data_type)
    if init.data_location == onnx.TensorProto.EXTERNAL:
        where = {e.key: e.value for e in init.external_data}
        if base is None or len(dims) < 3 or "location" not in where:
            return ""
        try:
            with open(base / where["location"], "rb") as f:
                f.seek(int(where.get("offset", 0)))
                raw = f.read(n * dtype.itemsize)
        except (OSError, ValueError):
            return ""
    elif init.raw_data:
        raw = init.raw_data[:n * dtype.itemsize]
    elif init.float_data or init.double_data:
        raw = numpy_helper.to_array(init).ravel()[:n].astype(dtype).tobytes()
    else:
        return ""
    head = np.frombuffer(raw, dtype, count=len(raw) // dtype.itemsize)
    if not head.size:
        return ""
    if head.min() <= MASK_FILL:
        keys = dims[-1]  # its first queries x keys:
        return "mask" if _orders(head[:head.size // keys * keys].reshape(-1, keys)) \
            else "padding"
    one = len(dims) >= 3 and dims[-3] == 1 and head.min() == head.max()
    return "fill" if one else ""


def patterns(graph: onnx.GraphProto, params: set[str]) -> set[str]:
    """Constant tensors, not parameters, that vary along both of their last two dims: a causal
    or windowed mask (queries x keys) folded at export or conversion. A mask made from a
    batch's padding alone holds none (its constant part is one value, or varies over the keys
    only)."""
    def wide(name: str, dims) -> bool:  # what could be a folded mask, never a weight
        return name not in params and len(dims) >= 2 and min(dims[-2:]) >= 2

    return {name for name, v in constants(graph, MASK_MAX_ELEMENTS, wide).items() if _orders(v)}


def _orders(v: np.ndarray) -> bool:
    """Whether `v` [..., queries, keys] varies along both of its last dims: it orders queries
    against keys (causal, a window), which a mask of padding alone does not."""
    return bool((v != v[..., :1]).any() and (v != v[..., :1, :]).any())


def square(shape) -> bool:
    """Whether a shape's last two dims are both known and wider than one."""
    return shape is not None and len(shape) >= 2 and all(
        isinstance(d, int) and d > 1 for d in shape[-2:])


class Ordering:
    """The tensors of masks, followed through the graph in topological order (`reads`), and the
    operators that read them (`readers`, the sequence's metadata): `mask_patterns`, masks that
    order queries against keys (a folded constant that varies over both of its last dims
    (`patterns`), a value-less square buffer of a weight-free export (a causal mask a module
    keeps), a comparison as wide as the scores, and what `MASK_OPS` make of them);
    `padding_masks`, `BATCH_OPS` applying what they make of the data inputs with no
    parameter (an attention mask given with the batch; token ids end at their embedding) or
    of a folded padding mask (`PADDING_KEY`). `fill`: the model's `fills`."""

    def __init__(self, model: onnx.ModelProto, params: set[str], data: set[str],
                 types: Mapping[str, _Tensor]):
        graph, self.fill, padding = model.graph, fills(model), listed(model, PADDING_KEY)
        valued = {i.name for i in graph.initializer} | self.fill | padding
        self.types, self.params, self.batch = types, params, set(data) | padding
        known = data | params | valued
        self.tensors = patterns(graph, params) | {
            i.name for i in graph.input
            if i.name not in known and square(self.shape_of(i.name))}
        self.readers: dict[str, list[str]] = {"mask_patterns": [], "padding_masks": []}

    def shape_of(self, tensor: str):
        return self.types.get(tensor, _NO_SHAPE).shape

    def reads(self, op_type: str, inputs: list[str], outputs: list[str]) -> tuple[str, ...]:
        """The `readers` this node is among: it reads an ordering mask (or makes one,
        comparing), or applies one made of the batch; its outputs are such masks where it is a
        mask's operator."""
        ordering = bool(self.tensors.intersection(inputs)) or op_type in COMPARISONS and bool(
            outputs) and square(self.shape_of(outputs[0]))
        batch = op_type in BATCH_OPS and bool(self.batch.intersection(inputs)) and \
            not self.params.intersection(inputs)
        if ordering and op_type in MASK_OPS:
            self.tensors.update(outputs)
        if batch:
            self.batch.update(outputs)
        return ("mask_patterns",) * ordering + ("padding_masks",) * batch

    def record(self, name: str, readers: Iterable[str]) -> None:
        """`name`, a node the sequence keeps, among `readers` (what `reads` said of it)."""
        for key in readers:
            self.readers[key].append(name)
