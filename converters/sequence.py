"""ONNX graph (shapes inferred) -> `OperatorSequence`: the work that runs, in topological order.

Host-side numpy with data-dependent shapes (one graph at a time); nothing here is jitted.

What is dropped: nodes that only compute shapes or constants (Constant, Shape, Size and every
node all of whose inputs are such values, e.g. the Gather/Concat arithmetic feeding a Reshape)
and Identity (an alias: consumers are rewired to its input). Everything reached by the data
(graph inputs and parameters) is kept. Op types outside the vocabulary are kept as `<unk>` and
counted in `unknown_ops`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from converters.errors import ConversionError
from converters.graph import PE_FUNCTIONS, depths, topological_order, CycleError
from converters.ops import HANDLERS, STATE_INPUTS, NodeView, numel
from converters.vocab import UNK_ID, VOCAB, VOCAB_VERSION, op_id

CONFIG_FIELDS = (
    "n_inputs", "n_outputs",
    "in_rank", "in_d0", "in_d1", "in_d2", "in_d3",
    "out_rank", "out_d0", "out_d1", "out_d2", "out_d3",
    "in_numel", "out_numel",
    "kernel_h", "kernel_w", "stride_h", "stride_w", "pad_h", "pad_w",
    "dilation_h", "dilation_w", "groups", "in_channels", "out_channels",
    "mm_batch", "mm_m", "mm_k", "mm_n", "axis", "elem_bytes", "n_param_inputs",
    "training_mode",
)
LOAD_FIELDS = ("fwd_flops", "bwd_flops", "bytes_read", "bytes_written", "params",
               "intensity")
_CFG = {name: i for i, name in enumerate(CONFIG_FIELDS)}
_DEFAULTS = np.zeros(len(CONFIG_FIELDS), np.float32)
for _name in ("stride_h", "stride_w", "dilation_h", "dilation_w", "groups"):
    _DEFAULTS[_CFG[_name]] = 1
_DEFAULTS[_CFG["axis"]] = -1
_SHAPE_OPS = {"Shape", "Size", "Constant"}  # outputs are never data, whatever the inputs
_ELEM_BYTES = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8,
               14: 8, 15: 16, 16: 2}
DATA_INPUTS_KEY = "mdot.data_inputs"  # model metadata: comma-separated data (non-param) inputs
FORMAT_VERSION = 1


@dataclass(frozen=True)
class OperatorSequence:
    """One model's training graph as a topologically ordered operator sequence (unpadded).

    Attributes (N operators, E edges, C = len(CONFIG_FIELDS), L = len(LOAD_FIELDS)):
      name: model name.
      op_type: `[N] int32` vocabulary ids (`converters.vocab`).
      config: `[N, C] float32` raw configuration (kernel, strides, shapes, ...; see
        `CONFIG_FIELDS`), not normalised.
      load: `[N, L] float32` computational load (`LOAD_FIELDS`): forward and backward FLOPs,
        bytes read and written, parameter count, FLOPs per byte.
      edges: `[E, 2] int32` data dependencies (src, dst) between operators, src < dst.
      node_names: `[N]` ONNX node names (for errors and per-operator attribution).
      meta: JSON-able dict: inputs (name -> shape), total params, unknown op counts,
        vocabulary and format versions, dropped shape-only nodes.
    """

    name: str
    op_type: np.ndarray
    config: np.ndarray
    load: np.ndarray
    edges: np.ndarray
    node_names: np.ndarray
    meta: dict = field(default_factory=dict)

    @property
    def num_ops(self) -> int:
        return int(self.op_type.shape[0])

    @property
    def flops(self) -> float:
        """Forward FLOPs of the whole graph."""
        return float(self.load[:, 0].astype(np.float64).sum())

    @property
    def params(self) -> int:
        """Parameters of the model (each parameter tensor counted once)."""
        return int(self.meta.get("params", 0))

    @property
    def unknown_ops(self) -> dict[str, int]:
        return dict(self.meta.get("unknown_ops", {}))

    def op_type_counts(self) -> dict[str, int]:
        ids, counts = np.unique(self.op_type, return_counts=True)
        names = {VOCAB[i]: int(c) for i, c in zip(ids, counts) if i != UNK_ID}
        names.update(self.unknown_ops)
        return dict(sorted(names.items(), key=lambda kv: (-kv[1], kv[0])))

    def depths(self) -> tuple[np.ndarray, np.ndarray]:
        """`([N], [N]) int32`: longest path from the inputs and to the outputs."""
        return depths(self.num_ops, self.edges)

    def degrees(self) -> tuple[np.ndarray, np.ndarray]:
        """`([N], [N]) int32`: in-degree and out-degree."""
        n = self.num_ops
        return (np.bincount(self.edges[:, 1], minlength=n).astype(np.int32),
                np.bincount(self.edges[:, 0], minlength=n).astype(np.int32))

    def positional_encoding(self, kind: str, dim: int) -> np.ndarray:
        """`[N, dim] float32` graph positional encoding, `kind` in `graph.PE_FUNCTIONS`."""
        if kind not in PE_FUNCTIONS:
            raise ValueError(f"unknown positional encoding {kind!r}; "
                             f"choose from {sorted(PE_FUNCTIONS)}")
        return PE_FUNCTIONS[kind](self.num_ops, self.edges, dim)

    def save(self, path: str | Path) -> None:
        """Writes one compressed `.npz` (atomically: temp file + rename)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez_compressed(
            tmp, op_type=self.op_type, config=self.config, load=self.load, edges=self.edges,
            node_names=self.node_names.astype(str),
            meta_json=np.asarray(json.dumps(dict(self.meta, name=self.name))))
        tmp.replace(path)

    @classmethod
    def load_npz(cls, path: str | Path) -> "OperatorSequence":
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(str(z["meta_json"]))
                if meta.get("format_version") != FORMAT_VERSION:
                    raise ConversionError(f"{path}: operator sequence format "
                                          f"{meta.get('format_version')} != {FORMAT_VERSION}")
                return cls(name=meta.pop("name", ""), op_type=z["op_type"],
                           config=z["config"], load=z["load"], edges=z["edges"],
                           node_names=z["node_names"], meta=meta)
        except (OSError, KeyError, ValueError) as e:
            if isinstance(e, ConversionError):
                raise
            raise ConversionError(f"{path}: not a readable operator sequence ({e})") from None


def _tensor_types(graph: onnx.GraphProto) -> dict[str, tuple[tuple[int, ...] | None, int]]:
    """Tensor name -> (concrete shape or None, ONNX element type)."""
    out: dict[str, tuple] = {}
    for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
        t = vi.type.tensor_type
        shape = None
        if t.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
            shape = tuple(dims) if all(d >= 0 for d in dims) else None
        out[vi.name] = (shape, t.elem_type)
    for init in graph.initializer:
        out[init.name] = (tuple(init.dims), init.data_type)
    return out


def _node_order(graph: onnx.GraphProto, sources: set[str]) -> tuple[list[int], dict[str, int]]:
    """Topological order of all nodes and the producer of every tensor."""
    nodes = graph.node
    producer: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for t in node.output:
            if t:
                producer[t] = i
    deps = []
    for i, node in enumerate(nodes):
        for t in node.input:
            if not t or t in sources:
                continue
            if t not in producer:
                raise ConversionError(
                    f"node '{node.name or i}' ({node.op_type}) reads tensor '{t}' that no node "
                    "produces and that is not a graph input or initializer")
            deps.append((producer[t], i))
    try:
        order = topological_order(len(nodes), np.asarray(deps, np.int64).reshape(-1, 2))
    except CycleError as e:
        node = nodes[e.node]
        raise ConversionError(f"the graph has a cycle through node '{node.name or e.node}' "
                              f"({node.op_type})") from None
    return order.tolist(), producer


def data_input_names(model: onnx.ModelProto) -> list[str]:
    meta = {p.key: p.value for p in model.metadata_props}
    if DATA_INPUTS_KEY in meta:
        return [n for n in meta[DATA_INPUTS_KEY].split(",") if n]
    inits = {i.name for i in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits]


def _shape_fields(row: np.ndarray, prefix: str, shape: tuple[int, ...] | None) -> None:
    """Rank and the last 4 dims, right-aligned; leading dims fold into the first slot."""
    if shape is None:
        return
    row[_CFG[prefix + "_rank"]] = len(shape)
    dims = list(shape)
    if len(dims) > 4:
        dims = [math.prod(dims[:-3])] + dims[-3:]
    dims = [1] * (4 - len(dims)) + dims
    for j, d in enumerate(dims):
        row[_CFG[f"{prefix}_d{j}"]] = d


def to_sequence(model: onnx.ModelProto, name: str = "") -> OperatorSequence:
    """Builds the operator sequence of a model whose shapes are concrete (see `loader`).

    Raises:
      ConversionError: empty graph, cycle, dangling tensor, or an operator whose cost cannot
        be computed from its shapes (the message names node, op and shapes).
    """
    graph = model.graph
    if len(graph.node) == 0:
        raise ConversionError(f"model '{name or graph.name}': the graph is empty (no nodes)")
    types = _tensor_types(graph)
    data_inputs = set(data_input_names(model))
    graph_inputs = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    params = {t for t in graph_inputs - data_inputs if types.get(t, (None, 0))[1] in
              (1, 10, 11, 16)}  # float, float16, double, bfloat16
    order, producer = _node_order(graph, graph_inputs)

    is_data = {t: True for t in data_inputs | params}
    alias: dict[str, str] = {}
    seq_index: dict[int, int] = {}
    rows, loads, ids, names, edges = [], [], [], [], []
    unknown: dict[str, int] = {}
    used_params: set[str] = set()
    dropped = 0
    for i in order:
        node = graph.node[i]
        inputs = [alias.get(t, t) for t in node.input]
        data = node.op_type not in _SHAPE_OPS and any(is_data.get(t, False) for t in inputs)
        for t in node.output:
            is_data[t] = data
        if not data:
            dropped += 1
            continue
        if node.op_type == "Identity":
            alias[node.output[0]] = inputs[0]
            continue
        j = len(ids)
        seq_index[i] = j
        row, load = _operator_features(node, inputs, types, params, unknown)
        rows.append(row)
        loads.append(load)
        ids.append(op_id(node.op_type))
        names.append(node.name or f"{node.op_type}_{i}")
        state = STATE_INPUTS.get(node.op_type, ())
        used_params.update(t for k, t in enumerate(inputs) if t in params and k not in state)
        for t in set(inputs):
            p = producer.get(t)
            if p is not None and p in seq_index:
                edges.append((seq_index[p], j))
    if not ids:
        raise ConversionError(f"model '{name or graph.name}': no operator depends on the "
                              "inputs (only constants and shape computations)")
    meta = dict(
        format_version=FORMAT_VERSION, vocab_version=VOCAB_VERSION,
        inputs={t: list(types[t][0] or []) for t in sorted(data_inputs) if t in types},
        params=int(sum(numel(types[t][0]) for t in used_params)),
        unknown_ops=dict(sorted(unknown.items())), dropped_nodes=dropped,
    )
    return OperatorSequence(
        name=name or graph.name, op_type=np.asarray(ids, np.int32),
        config=np.stack(rows).astype(np.float32), load=np.stack(loads).astype(np.float32),
        edges=np.asarray(sorted(set(edges)), np.int32).reshape(-1, 2),
        node_names=np.asarray(names), meta=meta)


def _operator_features(node, inputs, types, params, unknown) -> tuple[np.ndarray, list]:
    """Configuration row `[C]` and load `[L]` of one compute node."""
    in_types = [types.get(t) if t else None for t in inputs]
    out_types = [types.get(t) if t else None for t in node.output]
    in_shapes = [ty[0] if ty else None for ty in in_types]
    out_shapes = [ty[0] if ty else None for ty in out_types]
    state = STATE_INPUTS.get(node.op_type, ())
    view = NodeView(op_type=node.op_type, name=node.name,
                    attrs={a.name: helper.get_attribute_value(a) for a in node.attribute},
                    in_shapes=in_shapes, out_shapes=out_shapes,
                    in_is_param=[t in params and k not in state for k, t in enumerate(inputs)])
    handler = HANDLERS.get(node.op_type)
    if handler is None:
        unknown[node.op_type] = unknown.get(node.op_type, 0) + 1
        flops, bwd_factor, extra = 0.0, 1.0, None
    else:
        try:
            flops, bwd_factor, extra = handler(view)
        except (TypeError, IndexError, ValueError, KeyError, ZeroDivisionError) as e:
            raise ConversionError(
                f"node '{node.name}' ({node.op_type}): cannot compute its cost from input "
                f"shapes {in_shapes} and output shapes {out_shapes} ({type(e).__name__}: {e})"
            ) from None

    row = _DEFAULTS.copy()
    row[_CFG["n_inputs"]] = sum(1 for s in in_shapes if s is not None)
    row[_CFG["n_outputs"]] = sum(1 for s in out_shapes if s is not None)
    first_in = next((s for s in in_shapes if s is not None), None)
    _shape_fields(row, "in", first_in)
    _shape_fields(row, "out", out_shapes[0] if out_shapes else None)
    row[_CFG["in_numel"]] = numel(first_in)
    row[_CFG["out_numel"]] = numel(out_shapes[0]) if out_shapes else 0
    elem = out_types[0][1] if out_types and out_types[0] else 1
    row[_CFG["elem_bytes"]] = _ELEM_BYTES.get(elem, 4)
    row[_CFG["n_param_inputs"]] = sum(view.in_is_param)
    for key, value in (extra or {}).items():
        row[_CFG[key]] = value

    def nbytes(ty):
        return numel(ty[0]) * _ELEM_BYTES.get(ty[1], 4) if ty and ty[0] is not None else 0

    read = float(sum(nbytes(ty) for ty in in_types))
    written = float(sum(nbytes(ty) for ty in out_types))
    n_params = float(sum(numel(s) for s, p in zip(in_shapes, view.in_is_param) if p))
    intensity = flops / max(read + written, 1.0)
    return row, [flops, bwd_factor * flops, read, written, n_params, intensity]
