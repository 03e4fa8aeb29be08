"""Sizes that the data decides: boolean-mask indexing (`logits[labels != -100]`, BART's
end-of-sentence tokens `hidden[eos_mask]`), `torch.nonzero`, `torch.where(cond)`,
`masked_select`, each an ONNX NonZero, and a detector's non-maximum suppression
(NonMaxSuppression): no shape gives their counts. `from_torch` records each one's share of
what it reads on its example (`converters.recording`: `SELECTED_KEY` for the NonZeros, in graph
order; `SUPPRESSED_KEY` for the suppressions, by node name), and `sized` gives it that share
at the shapes asked, so the selection grows with the batch and the sequence as the
example's did."""

from __future__ import annotations

import json
import math
from typing import Any

import onnx
from onnx import helper

from converters.errors import ConversionError
from converters.sequence import SELECTED_KEY

SUPPRESSED_KEY = "mdot.suppressed"  # model metadata: each NonMaxSuppression's share kept (JSON)
SELECTING = ("NonZero", "NonMaxSuppression")  # the ONNX nodes whose counts the data decides


def sized(model: onnx.ModelProto, shapes: dict[str, list[int]], label: str) -> bool:
    """Gives each NonZero whose input's shape is known and whose count is not yet its recorded
    share of the input's elements (a `value_info`; a share of nan: none), and each
    NonMaxSuppression its share of its boxes. Returns whether any was given."""
    said = {p.key: p.value for p in model.metadata_props}
    nodes = [n for n in model.graph.node if n.op_type == "NonZero"]
    shares = _fractions(said, SELECTED_KEY, list, label) if nodes else []
    kept = _fractions(said, SUPPRESSED_KEY, dict, label)
    if len(shares) != len(nodes):
        shares = [math.nan] * len(nodes)  # not what this graph selects: its NonZeros unsized
    given = False
    for node, share in zip(nodes, shares):
        given |= _give(model, node, shapes.get(node.input[0]), share, shapes)
    for node in model.graph.node:
        if node.op_type == SELECTING[1] and node.name in kept:
            given |= _give(model, node, shapes.get(node.input[1]), kept[node.name], shapes)
    return given


def folding(model: onnx.ModelProto, folded: set[int]) -> None:
    """Drops from `model`'s recorded shares those of the NonZeros about to be folded away
    (ids in `folded`: a selection from constants alone, D-FINE's denoising groups'), so that
    the shares still line up with the NonZeros left, in order."""
    nodes = [n for n in model.graph.node if n.op_type == "NonZero"]
    said = next((p for p in model.metadata_props if p.key == SELECTED_KEY), None)
    if said is None or not any(id(n) in folded for n in nodes):
        return
    shares = _fractions({said.key: said.value}, SELECTED_KEY, list, "")
    if len(shares) == len(nodes):
        said.value = json.dumps([s for n, s in zip(nodes, shares) if id(n) not in folded])


def _fractions(said: dict[str, str], key: str, kind: type, label: str) -> Any:
    """Metadata `key`'s fractions (a list, or a dict by node name); empty where not said."""
    if key not in said:
        return kind()
    try:
        value = json.loads(said[key])
    except ValueError:
        value = None
    values = value.values() if isinstance(value, dict) else value
    if not isinstance(value, kind) or not all(
            isinstance(s, (int, float)) and (0 <= s <= 1 or math.isnan(s)) for s in values):
        raise ConversionError(f"{label}: metadata {key!r} is not a {kind.__name__} of "
                              f"fractions: {said[key]!r:.40}")
    return value


def _give(model: onnx.ModelProto, node: Any, have: list[int] | None, share: float,
          shapes: dict[str, list[int]]) -> bool:
    """Sets `node`'s output to `share` of what it reads (`have`'s elements): a NonZero's
    indices [rank, count], a NonMaxSuppression's [count, 3]. Whether it did."""
    if have is None or node.output[0] in shapes or math.isnan(share):  # nan: not known
        return False
    n = math.prod(have)
    count = max(round(share * n), 1) if share > 0 else 0
    shape = [max(len(have), 1), count] if node.op_type == "NonZero" else [count, 3]
    model.graph.value_info.append(helper.make_tensor_value_info(
        node.output[0], onnx.TensorProto.INT64, shape))
    return True


def unpacked(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with each SequenceAt of a SequenceConstruct at a constant position the tensor
    it takes (`torch.where(mask)[0]`, `x.unbind(d)[k]`: `symbolics`), and each
    SequenceConstruct none reads any more dropped: shape inference gives tensors shapes,
    sequences none. In place."""
    from onnx import numpy_helper

    graph = model.graph
    made = {n.output[0]: list(n.input) for n in graph.node if n.op_type == "SequenceConstruct"}
    if not made:
        return model
    consts = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    consts |= {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in graph.node
               if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"}
    for node in graph.node:
        items = made.get(node.input[0]) if node.op_type == "SequenceAt" else None
        at = consts.get(node.input[1]) if items else None
        if items and at is not None and at.size == 1 and -len(items) <= int(at) < len(items):
            node.op_type, node.input[:] = "Identity", [items[int(at)]]
    read = {t for n in graph.node for t in n.input} | {o.name for o in graph.output}
    kept = [n for n in graph.node if n.op_type != "SequenceConstruct" or n.output[0] in read]
    del graph.node[:]
    graph.node.extend(kept)
    return model
