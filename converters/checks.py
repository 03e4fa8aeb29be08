"""What a graph must be for its operator sequence to mean what it says: every layer's own
weights, positions within the model's tables, shapes known; each failure is one error naming
the node and what to do."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import onnx

from converters.errors import ConversionError, PastPositions
from converters.fusion import Node as _Node
from converters.tensors import _NO_SHAPE, _Tensor


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


# operators whose output holds their first input's values, rearranged or repeated
_SAME_VALUES = frozenset({"Unsqueeze", "Squeeze", "Reshape", "Expand", "Cast", "Identity",
                          "Flatten", "Transpose", "Tile"})


def _largest_index(graph: onnx.GraphProto) -> Callable[[str], int | None]:
    """The largest value a tensor of `graph` holds where constants decide it: folded indices,
    or a Range of constant bounds (too long to fold: 2M positions) rearranged (`_SAME_VALUES`)
    or shifted by a constant; None where anything else decides it."""
    from onnx import numpy_helper

    inits = {i.name: i for i in graph.initializer}
    made = {o: n for n in graph.node for o in n.output}

    def const(t: str) -> list[int] | None:
        if t not in inits:
            return None
        values = numpy_helper.to_array(inits[t])
        return [int(values.min()), int(values.max())] if values.size else None

    def largest(t: str, depth: int = 0) -> int | None:
        if (c := const(t)) is not None or t not in made or depth > 16:
            return None if c is None else c[1]
        node = made[t]
        if node.op_type in _SAME_VALUES:
            return largest(node.input[0], depth + 1)
        if node.op_type == "Range" and all(bounds := [const(i) for i in node.input]):
            start, limit, delta = (b[0] for b in bounds)  # type: ignore[index]
            count = max(-(-(limit - start) // delta), 0) if delta else 0
            return None if not count else max(start, start + (count - 1) * delta)
        if node.op_type == "Add" and len(node.input) == 2:
            for a, b in (node.input, node.input[::-1]):
                if (c := const(b)) is not None and c[0] == c[1]:  # shifted by one constant
                    top = largest(a, depth + 1)
                    return None if top is None else top + c[1]
        return None

    return largest


def _refuse_rows_past_the_table(graph: onnx.GraphProto, weights: set[str],
                                types: dict[str, _Tensor], label: str) -> None:
    """A Gather of a weight table at constant indices past its rows: a sequence longer than
    the positions a model has (GPT-2's 1,024 at --seq-len 4096) would run off its table."""
    largest = _largest_index(graph)
    for node in graph.node:
        if node.op_type != "Gather" or node.input[0] not in weights:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        shape = list(types[node.input[0]].shape or [])
        top = largest(node.input[1])
        if shape and top is not None and top >= shape[axis]:
            raise PastPositions(
                f"model '{label}': node '{node.name}' reads row {top} of "
                f"'{node.input[0]}', which has {shape[axis]} (shape {list(shape)}): the input "
                f"is longer than the {shape[axis]} positions the model has",
                label, shape[axis], node.name)


def stored_arrays(path: object, z: Mapping, meta: object, widths: tuple[int, int],
                  version: int) -> None:
    """Refuses an operator sequence's stored arrays (`OperatorSequence.save`'s, read back from
    `path`) of another format `version`, or not what it writes (`_stored_problem`)."""
    if isinstance(meta, dict) and meta.get("format_version") != version:
        raise ConversionError(f"{path}: operator sequence format {meta.get('format_version')} "
                              f"!= {version}")
    wrong = (f"its metadata is a {type(meta).__name__}, not an object" if not isinstance(
        meta, dict) else _stored_problem(z, widths))
    if wrong:
        raise ConversionError(f"{path}: not a readable operator sequence ({wrong})")


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
    if domain not in ("", "ai.onnx"):
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
