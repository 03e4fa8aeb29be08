"""What a graph must be for its operator sequence to mean what it says: every layer's own
weights, positions within the model's tables, shapes known; each failure is one error naming
the node and what to do."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import cast

import numpy as np
import onnx

from converters.errors import ConversionError, PastPositions
from converters.fusion import Node as _Node
from converters.tensors import _NO_SHAPE, TOKEN_TYPES, _Tensor, token_inputs


def merged_aliases(graph: onnx.GraphProto, weights: set[str], declared: set[str]
                   ) -> list[onnx.NodeProto]:
    """The `Identity` nodes that give a declared parameter as an alias of another weight
    input: the exporter merged equal-shaped weights (the TorchScript exporter does so on the
    meta device), and the parameters would be counted once for many layers."""
    return [n for n in graph.node if n.op_type == "Identity" and n.input
            and n.input[0] in weights and n.output[0] in declared and n.output[0] not in weights]


def _refuse_merged(graph: onnx.GraphProto, floats: set[str], declared: set[str],
                   label: str) -> None:
    """A file exported with merged weights (`merged_aliases`) is refused, naming the first."""
    for node in merged_aliases(graph, floats, declared)[:1]:
        raise ConversionError(
            f"model '{label}': parameter '{node.output[0]}' is an alias of "
            f"'{node.input[0]}' (node '{node.name}'): the exporter merged equal-shaped "
            "weights, as it does for a model on the meta device; export it again with "
            "converters.from_torch, which keeps each layer's weights")


# operators whose output holds some of their first input's values, rearranged or repeated
_SAME_VALUES = frozenset({"Unsqueeze", "Squeeze", "Reshape", "Expand", "Cast", "Identity",
                          "Flatten", "Transpose", "Tile", "Slice", "Gather", "GatherElements"})


_MOST_CONSTANT = 1 << 22  # elements of a constant read for its values (folded positions)
# operators whose output is true or false (0 or 1 once cast)
_TRUTHS = frozenset({"Equal", "Not", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And",
                     "Or", "Xor", "IsNaN", "IsInf"})


def _constant_protos(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    """Initializers and Constant nodes' values by name, unread (weights may be large)."""
    consts = {i.name: i for i in graph.initializer}
    consts.update({n.output[0]: a.t for n in graph.node if n.op_type == "Constant"
                   for a in n.attribute if a.name == "value"})
    return consts


def _index_bounds(graph: onnx.GraphProto, types: Mapping[str, _Tensor], weights: set[str]
                  ) -> Callable[[str], tuple[int, int] | None]:
    """The least and largest values a tensor of `graph` can hold where its graph decides them:
    constants (folded indices), a Range of constant bounds (too long to fold: 2M positions),
    truths (a padding mask), their running sum along a dim (RoBERTa's and OPT's positions from
    the mask: at most its length, and at most a data input's longest dim: Longformer pads its
    tokens to its window, the pads no positions), some of the values of others
    (`_SAME_VALUES`, Concat, Where, Min, Max), sums, differences and products; None where
    anything else decides them (an input's values)."""
    from onnx import numpy_helper

    consts = _constant_protos(graph)  # read when asked: weights may be large
    made = {o: n for n in graph.node for o in n.output}
    known: dict[str, tuple[int, int] | None] = {}
    longest = max((d for i in graph.input if i.name not in consts and i.name not in weights
                   for d in types.get(i.name, _NO_SHAPE).shape or ()), default=None)

    def interval(values: np.ndarray) -> tuple[int, int] | None:
        return (math.floor(values.min()), math.ceil(values.max())) if values.size and \
            np.isfinite(values).all() else None

    def bounds(t: str, depth: int = 0) -> tuple[int, int] | None:
        if t not in known:
            known[t] = _bounds(t, depth)
        return known[t]

    def _bounds(t: str, depth: int) -> tuple[int, int] | None:
        if t in consts:
            small = math.prod(consts[t].dims) <= _MOST_CONSTANT
            return interval(numpy_helper.to_array(consts[t])) if small else None
        node = made.get(t)
        if node is None or depth > 32:
            return None
        kind, attrs = node.op_type, {a.name: a for a in node.attribute}
        if kind in _TRUTHS or (kind == "Cast" and "to" in attrs
                               and attrs["to"].i == onnx.TensorProto.BOOL):
            return 0, 1
        if kind == "ConstantOfShape":
            return interval(numpy_helper.to_array(attrs["value"].t)) if "value" in attrs \
                else (0, 0)
        read = node.input[:1] if kind in _SAME_VALUES else node.input[kind == "Where":]
        found = [bounds(i, depth + 1) for i in read]
        if not read or None in found:
            return None
        inputs = cast(list[tuple[int, int]], found)
        if kind in _SAME_VALUES or kind in ("Concat", "Where", "Min", "Max"):
            return min(r[0] for r in inputs), max(r[1] for r in inputs)
        if kind == "Range" and len(inputs) == 3 and all(r[0] == r[1] for r in inputs):
            start, limit, delta = (r[0] for r in inputs)
            count = max(-(-(limit - start) // delta), 0) if delta else 0
            return None if not count else (min(start, end := start + (count - 1) * delta),
                                           max(start, end))
        if kind in ("Add", "Sub", "Mul") and len(inputs) == 2:
            (a, b), (c, d) = inputs
            if kind != "Mul":
                return (a + c, b + d) if kind == "Add" else (a - d, b - c)
            corners = (a * c, a * d, b * c, b * d)
            return min(corners), max(corners)
        shape = types.get(node.input[0], _NO_SHAPE).shape
        if kind == "CumSum" and shape and inputs[1][0] == inputs[1][1] and (
                -len(shape) <= (axis := inputs[1][0]) < len(shape)):
            n, (low, high) = min(shape[axis], longest or shape[axis]), inputs[0]
            return min(0, low, n * low), max(0, high, n * high)
        return None

    return bounds


def _refuse_rows_past_the_table(graph: onnx.GraphProto, weights: set[str],
                                types: dict[str, _Tensor], label: str) -> None:
    """A Gather of a weight table at constant indices past its rows: a sequence longer than
    the positions a model has (GPT-2's 1,024 at --seq-len 4096) would run off its table."""
    bounds = _index_bounds(graph, types, weights)
    for node in graph.node:
        if node.op_type != "Gather" or node.input[0] not in weights:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        shape = list(types[node.input[0]].shape or [])
        top = (bounds(node.input[1]) or (0, None))[1]
        if shape and top is not None and top >= shape[axis]:
            raise PastPositions(
                f"model '{label}': node '{node.name}' reads row {top} of "
                f"'{node.input[0]}', which has {shape[axis]} (shape {list(shape)}): the input "
                f"is longer than the {shape[axis]} positions the model has",
                label, shape[axis], node.name, top)


def refuse_sliced_positions(model: onnx.ModelProto, label: str) -> None:
    """A sequence longer than the position ids a model holds as a constant (BERT's buffer of
    `max_position_embeddings`, sliced to the input's length: PyTorch's slice stops at its
    end, so a longer input meets too few positions and the shapes disagree): refused naming
    them, where shape inference failed (not a shape fixed at export). `model`: its data inputs
    concrete."""
    graph = model.graph
    long = max((i.type.tensor_type.shape.dim[1].dim_value for i in token_inputs(graph)),
               default=0)
    consts = _constant_protos(graph)
    read_by: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for t in n.input:
            read_by.setdefault(t, []).append(n)

    def indexes(t: str, depth: int = 0) -> bool:  # a table's rows, through views and shifts
        return depth < 8 and any(
            (n.op_type == "Gather" and n.input[1] == t) or (n.op_type in _SAME_VALUES | {
                "Add"} and indexes(n.output[0], depth + 1)) for n in read_by.get(t, ()))

    for node in graph.node:
        if node.op_type != "Slice" or node.input[0] not in consts:
            continue
        ids = consts[node.input[0]]  # a meta-device export's holds zeros: its shape tells
        if ids.data_type in TOKEN_TYPES and len(
                ids.dims) in (1, 2) and 1 < (n := ids.dims[-1]) < long and indexes(
                node.output[0]):
            raise PastPositions(
                f"model '{label}': node '{node.name}' slices the {n} position ids the model "
                f"holds (constant '{node.input[0]}') for an input of {long}: the input is "
                f"longer than the {n} positions the model has", label, n, node.name, long - 1)


# the metadata every operator sequence's `save` writes, and its JSON types
_STORED_META = dict(graph=dict, inputs=dict, integer_inputs=list, params=int, unknown_ops=dict,
                    dropped_nodes=int, fused=dict, fusion_version=int, vocab_version=int)


def stored_arrays(path: object, z: Mapping, meta: object, widths: tuple[int, int],
                  version: int) -> None:
    """Refuses an operator sequence's stored arrays (`OperatorSequence.save`'s, read back from
    `path`) of another format `version`, or not what it writes (`_stored_problem`)."""
    if isinstance(meta, dict) and meta.get("format_version") != version:
        raise ConversionError(f"{path}: operator sequence format {meta.get('format_version')} "
                              f"!= {version}")
    wrong = (f"its metadata is a {type(meta).__name__}, not an object" if not isinstance(
        meta, dict) else _meta_problem(meta) or _stored_problem(z, widths))
    if wrong:
        raise ConversionError(f"{path}: not a readable operator sequence ({wrong})")


def _meta_problem(meta: dict) -> str | None:
    """The first field every `save` writes (`_STORED_META`) that holds another JSON type."""
    for k, kind in _STORED_META.items():
        if k in meta and type(meta[k]) is not kind:
            return (f"its metadata's {k} is {json.dumps(meta[k])[:40]}: expected "
                    + ("an object" if kind is dict else f"a {kind.__name__}"))
    return None


def _stored_problem(z: Mapping, widths: tuple[int, int]) -> str | None:
    """What is not as `OperatorSequence.save` writes it (`widths`: the config's and the load's
    columns): a type id, a config row, a load row and a name a node, finite numbers, edges
    between its nodes in order."""
    kinds = np.asarray(z["op_type"])
    if kinds.ndim != 1 or kinds.dtype.kind not in "iu" or (kinds.size and kinds.min() < 0):
        return f"op_type {kinds.dtype}{list(kinds.shape)}: expected one type id a node"
    n = len(kinds)
    for key, width in zip(("config", "load"), widths):
        a = np.asarray(z[key])
        if a.shape != (n, width) or a.dtype.kind != "f" or not np.isfinite(a).all():
            return f"{key} {a.dtype}{list(a.shape)}: expected [{n}, {width}] finite numbers"
    names, edges = np.asarray(z["node_names"]), np.asarray(z["edges"])
    if names.shape != (n,) or names.dtype.kind != "U":
        return f"node_names {names.dtype}{list(names.shape)}: expected {n} names"
    if edges.ndim != 2 or edges.shape[1] != 2 or edges.dtype.kind not in "iu" or (
            edges.size and not ((0 <= edges[:, 0]) & (edges[:, 0] < edges[:, 1])
                                & (edges[:, 1] < n)).all()):
        return f"edges {edges.dtype}{list(edges.shape)}: expected [E, 2] of nodes 0-{n - 1}"
    return None


def _lost_shape(tensor: str, nodes: list[_Node], producer: dict[str, int],
                types: dict[str, _Tensor], valueless: set[str]) -> ConversionError:
    """Names the node where shape inference lost track of `tensor`'s shape, and why: the first
    producer upstream whose inputs have shapes but whose output has none."""
    known = lambda t: not t or types.get(t, _NO_SHAPE).shape is not None  # noqa: E731
    if tensor not in producer:
        return ConversionError(f"input '{tensor}': shape unknown")
    i = producer[tensor]
    while True:
        lost = [t for t in nodes[i].inputs if not known(t) and t in producer]
        if not lost:
            break
        i = producer[lost[0]]
    node = nodes[i]
    domain = node.proto.domain
    label = f"node '{node.name or node.outputs[0]}' ({f'{domain} ' if domain else ''}" \
            f"{node.op_type})"
    grads = [n for n in nodes if n.proto.domain == "com.microsoft" and (
        n.op_type.endswith("Grad") or n.op_type.startswith("InPlaceAccumulator"))]
    if domain not in ("", "ai.onnx") and grads:
        cause = ("the graph holds its backward already (onnxruntime-training's gradient "
                 f"operators: {', '.join(sorted({n.op_type for n in grads}))}); give the "
                 "forward graph it was built from: its backward and update are priced from it")
    elif domain not in ("", "ai.onnx"):
        cause = ("an operator outside the ONNX standard, which shape inference does not know; "
                 "export with standard operators (without runtime-specific fusions)")
    elif node.op_type in ("Loop", "Scan", "If"):
        cause = ("control flow, whose body's shapes depend on run-time values: export the "
                 "model with the loop unrolled or the branch taken (torch.onnx traces them so; "
                 "jax2onnx: without lax.while_loop / lax.scan / lax.cond)")
    elif node.op_type == "NonZero":
        cause = ("a size the data decides (`x[mask]`, `torch.nonzero`, `torch.where(cond)`), "
                 "which `converters.from_torch` records on its example; from another exporter, "
                 "select by positions (`x[:, -1]`, `torch.gather`) or export without it")
    elif bad := [t for t in node.inputs if t in valueless]:
        cause = (f"its input '{bad[0]}' holds values that are not in the file (external data "
                 "or a graph input), so the shape they set cannot be read")
    else:
        cause = (f"shape inference could not infer its output from input shapes "
                 f"{[types.get(t, _NO_SHAPE).shape for t in node.inputs]}")
    return ConversionError(f"{label}: output shape unknown: {cause}")
