"""ONNX graph (shapes inferred) -> `OperatorSequence`: the work that runs, in topological order
(host-side numpy with data-dependent shapes, one graph at a time; nothing here is jitted).

What is dropped: nodes that only compute shapes or constants (Constant, Shape, Size and every
node all of whose inputs are such values, e.g. the Gather/Concat arithmetic feeding a Reshape)
and Identity (an alias: consumers are rewired to its input). Everything reached by the data
(graph inputs and parameters) is kept. Op types outside the vocabulary are kept as `<unk>` and
counted in `unknown_ops`.
"""

from __future__ import annotations

import json
import math
import uuid
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

import converters.checks as checks
from converters.checks import _lost_shape, _refuse_merged, _refuse_rows_past_the_table
from converters.errors import ConversionError
from converters.fusion import VIEWS, constants, fusion_version
from converters.fusion import Node as _Node
from converters.fusion import fuse as fuse_kernels
from converters.graph import PE_FUNCTIONS, CycleError, depths, topological_order
from converters.kept import KEPT
from converters.kind import graph_kind
from converters.masks import Ordering
from converters.ops import HANDLERS, STATE_INPUTS, NodeView
from converters.scopes import scoped_names
from converters.tensors import _ELEM_BYTES, _NO_SHAPE, FLOAT_TYPES, _Tensor, _tensor_types, half_of
from converters.vocab import UNK_ID, VOCAB, VOCAB_VERSION, op_id

CONFIG_FIELDS = (
    "n_inputs", "n_outputs", "in_rank", "in_d0", "in_d1", "in_d2", "in_d3",
    "out_rank", "out_d0", "out_d1", "out_d2", "out_d3", "in_numel", "out_numel",
    "kernel_h", "kernel_w", "stride_h", "stride_w", "pad_h", "pad_w",
    "dilation_h", "dilation_w", "groups", "in_channels", "out_channels",
    "mm_batch", "mm_m", "mm_k", "mm_n", "axis", "elem_bytes", "n_param_inputs", "training_mode",
)
LOAD_FIELDS = ("fwd_flops", "bwd_flops", "bytes_read", "bytes_written", "params", "intensity")
_CFG = {name: i for i, name in enumerate(CONFIG_FIELDS)}
_LOAD = {name: i for i, name in enumerate(LOAD_FIELDS)}
_DEFAULTS = np.zeros(len(CONFIG_FIELDS), np.float32)
for _name in ("stride_h", "stride_w", "dilation_h", "dilation_w", "groups"):
    _DEFAULTS[_CFG[_name]] = 1
_DEFAULTS[_CFG["axis"]] = -1
_SHAPE_OPS = {"Shape", "Size", "Constant"}  # outputs are never data, whatever the inputs
DATA_INPUTS_KEY = "mdot.data_inputs"  # model metadata: comma-separated data (non-param) inputs
PARAMS_KEY = "mdot.params"  # model metadata: the parameters, when the exporter knows
FROZEN_KEY = "mdot.frozen"  # model metadata: those of them frozen (requires_grad off)
EXPERTS_KEY = "mdot.experts"  # model metadata: a mixture of experts exported as balanced routing
DEFAULTED_KEY = "mdot.defaulted"  # model metadata: shape fields a config.json left to defaults
EAGER_KEY = "mdot.eager_attention"  # model metadata: a config class computing attention itself
LINEAR_KEY = "mdot.linear_attention"  # model metadata: `converters.substitutes` names used
SELECTED_KEY = "mdot.selected"  # model metadata: each NonZero's share of its input (JSON list)
STATE_SPACE_KEY = "mdot.state_space"  # model metadata: its Mamba-2 heads and groups (JSON)
SPARSE_KEY = "mdot.sparse_attention"  # model metadata: keys a query keeps (DeepSeek's indexer)
SLIDING_KEY = "mdot.sliding_window"  # model metadata: each layer's sliding window (JSON; 0 none)
CHECKPOINTED_KEY = "mdot.checkpointed"  # model metadata: its code checkpoints activations
UNREAD_KEY = "mdot.unread"  # model metadata: parameters the traced step never reads (JSON)
BATCH_KEY = "mdot.batch_inputs"  # model metadata: the data inputs whose dim 0 is the batch
PACKED_KEY = "mdot.packed"  # model metadata: recurrent layers given packed sequences (JSON)
HEAD_KEY = "mdot.head"  # model metadata: the classifier a config.json's architectures named
NO_FLASH_KEY = "mdot.no_flash_attn"  # model metadata: a config class FA2 is refused for (JSON)
LISTED_KEY = "mdot.listed"  # model metadata: a batch given as a list of samples (JSON)
JSON_KEYS = dict(experts=EXPERTS_KEY, defaulted=DEFAULTED_KEY, sliding_window=SLIDING_KEY,
                 state_space=STATE_SPACE_KEY, unread=UNREAD_KEY, packed=PACKED_KEY, head=HEAD_KEY,
                 batch_inputs=BATCH_KEY, selected=SELECTED_KEY, no_flash_attn=NO_FLASH_KEY,
                 listed=LISTED_KEY)
TIED_KEY = "mdot.tied"  # model metadata: parameters that repeat another's values (counted once)
SDPA_KEY = "mdot.sdpa_softmax"  # model metadata: scaled_dot_product_attention's Softmax ordinals
FORMAT_VERSION = 1
INPUT_KINDS = ((4, "image"), (3, "signal"), (2, "tokens"))  # data input rank -> kind, in order


@dataclass(frozen=True)
class OperatorSequence:
    """One model's training graph as a topologically ordered operator sequence (unpadded).

    Attributes (N operators, E edges, C = len(CONFIG_FIELDS), L = len(LOAD_FIELDS)):
      name: model name.
      op_type: `[N] int32` vocabulary ids (`converters.vocab`).
      config: `[N, C] float32` raw configuration (`CONFIG_FIELDS`: kernel, strides, shapes).
      load: `[N, L] float32` computational load (`LOAD_FIELDS`): forward and backward FLOPs,
        bytes read and written, parameter count, FLOPs per byte.
      edges: `[E, 2] int32` data dependencies (src, dst) between operators, src < dst.
      node_names: `[N]` ONNX node names (a dynamo export's by module scope,
        `converters.scopes`), for per-operator attribution and layers.
      meta: JSON-able dict: inputs (name -> shape), integer_inputs (names), total params
        (frozen ones, and the operators all of whose parameters are, where any), unknown op counts,
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
    def op_names(self) -> np.ndarray:
        """`[N]` operator type names (`<unk>` for ids of a newer vocabulary)."""
        return np.asarray(VOCAB)[np.where(self.op_type < len(VOCAB), self.op_type, UNK_ID)]

    @property
    def fusion(self) -> int:
        """The `converters.fusion` version it was converted with; 0 without fusion (sequences
        from before versions were recorded are version 1)."""
        return int(self.meta.get("fusion_version", 1)) if "fused" in self.meta else 0

    def column(self, field: str) -> np.ndarray:
        """`[N] float64`: one of `LOAD_FIELDS` for every operator, by name."""
        return self.load[:, _LOAD[field]].astype(np.float64)

    def total(self, field: str) -> float:
        """One of `LOAD_FIELDS` summed over the graph (`"bytes"`: read and written)."""
        if field == "bytes":
            return self.total("bytes_read") + self.total("bytes_written")
        return float(self.column(field).sum())

    @property
    def flops(self) -> float:
        """Forward FLOPs of the whole graph."""
        return self.total("fwd_flops")

    @property
    def kind_input(self) -> tuple[str, list[int]]:
        """What the workload's input size measures and the data input that carries it: an
        `image` (rank 4) before a `signal` (rank 3, [B, C, T]) before `tokens` (token ids: rank
        2, integer; older sequences name no types), so that a side input such as metadata
        [B, 16] does not decide; `other` (and []) otherwise."""
        ints = self.meta.get("integer_inputs")
        shapes = [s for n, s in self.meta.get("inputs", {}).items()
                  if len(s) != 2 or ints is None or n in ints]
        return next(((kind, s) for rank, kind in INPUT_KINDS for s in shapes if len(s) == rank),
                    ("other", []))

    @property
    def input_kind(self) -> str:
        return self.kind_input[0]

    @property
    def params(self) -> int:
        """Parameters of the model (each parameter tensor counted once)."""
        return int(self.meta.get("params", 0))

    @property
    def unknown_ops(self) -> dict[str, int]:
        return dict(self.meta.get("unknown_ops", {}))

    def op_type_counts(self) -> dict[str, int]:
        ids, counts = np.unique(self.op_type, return_counts=True)
        names = {VOCAB[i]: int(c) for i, c in zip(ids, counts)  # ids of a newer vocabulary
                 if i != UNK_ID and i < len(VOCAB)}  # than this one's: no name here
        names.update(self.unknown_ops)
        return dict(sorted(names.items(), key=lambda kv: (-kv[1], kv[0])))

    def flops_by_type(self) -> dict[str, float]:
        """Forward FLOPs per operator type, largest first (unknown types carry none)."""
        flops = self.column("fwd_flops")
        totals = {VOCAB[i]: float(flops[self.op_type == i].sum())
                  for i in np.unique(self.op_type) if i != UNK_ID}
        return dict(sorted(totals.items(), key=lambda kv: -kv[1]))

    def depths(self) -> tuple[np.ndarray, np.ndarray]:
        """`([N], [N]) int32`: longest path from the inputs and to the outputs."""
        return depths(self.num_ops, self.edges)

    def degrees(self) -> tuple[np.ndarray, np.ndarray]:
        """`([N], [N]) int32`: in-degree and out-degree."""
        n = self.num_ops
        return (np.bincount(self.edges[:, 1], minlength=n).astype(np.int32),
                np.bincount(self.edges[:, 0], minlength=n).astype(np.int32))

    def neighbours(self) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
        """`(preds, succs)`: each operator's producers (the operators whose outputs it reads)
        and consumers, where it has any. Shared by every sequence with these edges (a
        tensor-parallel shard): read them, never change them."""
        def build() -> tuple[dict[int, list[int]], dict[int, list[int]]]:
            preds: dict[int, list[int]] = {}
            succs: dict[int, list[int]] = {}
            for src, dst in self.edges.tolist():
                preds.setdefault(dst, []).append(src)
                succs.setdefault(src, []).append(dst)
            return preds, succs
        return KEPT.get(("neighbours", self.edges), build)

    def positional_encoding(self, kind: str, dim: int) -> np.ndarray:
        """`[N, dim] float32` graph positional encoding, `kind` in `graph.PE_FUNCTIONS`."""
        if kind not in PE_FUNCTIONS:
            raise ValueError(f"unknown positional encoding {kind!r}; "
                             f"choose from {sorted(PE_FUNCTIONS)}")
        return PE_FUNCTIONS[kind](self.num_ops, self.edges, dim)

    def save(self, path: str | Path) -> None:
        """Writes one compressed `.npz` (atomically: a hidden temp file `.NAME.tmp-*.npz`,
        then a rename)."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}.npz")
        np.savez_compressed(
            tmp, op_type=self.op_type, config=self.config, load=self.load, edges=self.edges,
            node_names=self.node_names.astype(str),
            meta_json=np.asarray(json.dumps(dict(self.meta, name=self.name))))
        tmp.replace(path)

    @classmethod
    def load_npz(cls, path: str | Path) -> OperatorSequence:
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(str(z["meta_json"]))
                checks.stored_arrays(path, z, meta, (len(CONFIG_FIELDS), len(LOAD_FIELDS)),
                                     FORMAT_VERSION)
                return cls(name=meta.pop("name", ""), op_type=z["op_type"], config=z["config"],
                           load=z["load"], edges=z["edges"], node_names=z["node_names"], meta=meta)
        except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile) as e:
            if isinstance(e, ConversionError):
                raise
            raise ConversionError(f"{path}: not a readable operator sequence ({e})") from None


def _node_order(nodes: list[_Node], sources: set[str]) -> tuple[list[int], dict[str, int]]:
    """Topological order of all nodes and the producer of every tensor."""
    producer = {t: i for i, node in enumerate(nodes) for t in node.outputs if t}
    deps = []
    for i, node in enumerate(nodes):
        for t in node.inputs:
            if not t or t in sources:
                continue
            p = producer.get(t)
            if p is None:
                raise ConversionError(
                    f"node '{node.name or i}' ({node.op_type}) reads tensor '{t}' that no node "
                    "produces and that is not a graph input or initializer")
            deps.append((p, i))
    try:
        order = topological_order(len(nodes), np.asarray(deps, np.int64).reshape(-1, 2))
    except CycleError as e:
        node = nodes[e.node]
        raise ConversionError(f"the graph has a cycle through node '{node.name or e.node}' "
                              f"({node.op_type})") from None
    return order.tolist(), producer


def _metadata(model: onnx.ModelProto) -> dict[str, str]:
    return {p.key: p.value for p in model.metadata_props}


def _sdpa_softmax(nodes: list, seq_index: dict[int, int], ordinals: str) -> list[int]:
    """Sequence indices of the Softmax nodes `SDPA_KEY` names by ordinal (fusion keeps each)."""
    softmax = [i for i, n in enumerate(nodes) if n.op_type == "Softmax"]
    return [seq_index[softmax[int(k)]] for k in ordinals.split(",")
            if k and int(k) < len(softmax) and softmax[int(k)] in seq_index]


# Where a graph input is read tells a weight from data, whatever the producer: the (op, slot)
# pairs that hold parameters, reached directly or through the view ops a weight passes on its
# way (a transposed Linear weight, a cast of fp16 weights). Add / Mul hold a bias or a scale
# when their other operand is computed by the graph.
WEIGHT_SLOTS = {"Conv": (1, 2), "ConvTranspose": (1, 2), "Gemm": (1, 2), "MatMul": (1,),
                "BatchNormalization": (1, 2, 3, 4), "LayerNormalization": (1, 2),
                "GroupNormalization": (1, 2), "InstanceNormalization": (1, 2),
                "RMSNormalization": (1,), "Gather": (0,), "PRelu": (1,)}
_AFFINE = {"Add", "Mul"}
_WEIGHT_PATH = {"Transpose", "Cast", "Identity", "Unsqueeze", "Squeeze", "Reshape", "Flatten"}


def _read_as_weight(name: str, consumers: dict[str, list[tuple[onnx.NodeProto, int]]],
                    computed: set[str]) -> bool:
    """Every read of tensor `name` is a weight slot, directly or through view ops."""
    uses = consumers.get(name, [])
    for node, k in uses:
        if node.op_type in _WEIGHT_PATH and k == 0:
            if not _read_as_weight(node.output[0], consumers, computed):
                return False
        elif node.op_type in _AFFINE and len(node.input) == 2:
            if node.input[1 - k] not in computed:
                return False
        elif k not in WEIGHT_SLOTS.get(node.op_type, ()):
            return False
    return bool(uses)


def data_input_names(model: onnx.ModelProto) -> list[str]:
    """The data (non-parameter) inputs: named by our exporters' metadata; otherwise the graph
    inputs that are not initializers, less the weights of a weight-free export
    (`export_params=False`): inputs with every dim fixed that are only read in weight slots.
    An input with a symbolic dim is data (weights are never batched)."""
    meta = _metadata(model)
    if DATA_INPUTS_KEY in meta:
        return [n for n in meta[DATA_INPUTS_KEY].split(",") if n]
    graph = model.graph
    inits = {i.name for i in graph.initializer}
    candidates = [i for i in graph.input if i.name not in inits]
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for k, t in enumerate(node.input):
            consumers.setdefault(t, []).append((node, k))
    computed = {t for node in graph.node if node.op_type != "Constant" for t in node.output}

    def fixed(vi) -> bool:
        return all(d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim)

    data = [i.name for i in candidates
            if not (fixed(i) and _read_as_weight(i.name, consumers, computed))]
    return data or [i.name for i in candidates]


_IN_SHAPE = _CFG["in_rank"]  # in_rank, in_d0..in_d3 are consecutive, and so are the out_*
_OUT_SHAPE = _CFG["out_rank"]
assert CONFIG_FIELDS[_IN_SHAPE:_IN_SHAPE + 5] == ("in_rank", "in_d0", "in_d1", "in_d2", "in_d3")
assert CONFIG_FIELDS[_OUT_SHAPE:_OUT_SHAPE + 5] == ("out_rank", "out_d0", "out_d1", "out_d2",
                                                    "out_d3")
_DEFAULT_ROW = _DEFAULTS.tolist()


def _shape_fields(shape: tuple[int, ...]) -> list[int]:
    """Rank and the last 4 dims, right-aligned; leading dims fold into the first slot."""
    dims = list(shape) if len(shape) <= 4 else [math.prod(shape[:-3]), *shape[-3:]]
    return [len(shape)] + [1] * (4 - len(dims)) + dims


def to_sequence(model: onnx.ModelProto, name: str = "", *, fuse: bool | int = False
                ) -> OperatorSequence:
    """Builds the operator sequence of a model whose shapes are concrete (see `loader`);
    `fuse` rewrites what the exporter decomposes but eager PyTorch runs as one kernel or not
    at all (`converters.fusion`; `True` is its latest version, an int that version).

    Raises:
      ConversionError: empty graph, cycle, dangling tensor, or an operator whose cost cannot
        be computed from its shapes (the message names node, op and shapes).
    """
    graph = model.graph
    if len(graph.node) == 0:
        raise ConversionError(f"model '{name or graph.name}': the graph is empty (no nodes)")
    types = _tensor_types(graph)
    nodes = [_Node(n.op_type, n.name, list(n.input), list(n.output), n) for n in graph.node]
    fused: dict[str, int] | None = None
    version = fusion_version(fuse)
    if version:
        nodes, fused = fuse_kernels(nodes, constants(graph), {o.name for o in graph.output},
                                    version, lambda t: types.get(t, _NO_SHAPE).shape)
    data_inputs = set(data_input_names(model))
    graph_inputs = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    floats = {t for t in graph_inputs - data_inputs if t in types and types[t].elem_type in
              FLOAT_TYPES}
    meta_params = _metadata(model).get(PARAMS_KEY)
    params = floats & set(meta_params.split(",")) if meta_params is not None else floats
    if meta_params is not None:
        _refuse_merged(graph, floats, set(meta_params.split(",")), name or graph.name)
    _refuse_rows_past_the_table(graph, floats, types, name or graph.name)
    tied = set(_metadata(model).get(TIED_KEY, "").split(","))
    frozen = params & set(_metadata(model).get(FROZEN_KEY, "").split(","))
    frozen_nodes: list[int] = []  # those all of whose parameters are frozen
    filled, scoped = [], scoped_names(graph.node)  # filled: Adds of a fill (no mask)
    masks = Ordering(model, params, data_inputs, types)  # causal and padding masks
    order, producer = _node_order(nodes, graph_inputs)

    is_data = dict.fromkeys(data_inputs | floats, True)
    alias: dict[str, str] = {}
    seq_index: dict[int, int] = {}
    rows: list[list[float]] = []  # [T][C]
    loads: list[list[float]] = []  # [T][L]
    ids: list[int] = []
    names: list[str] = []
    edges: list[tuple[int, int]] = []
    unknown: dict[str, int] = {}
    readers: dict[str, list[int]] = {}  # each parameter used: the operators reading it
    dropped = 0
    for i in order:
        node = nodes[i]
        inputs = [alias.get(t, t) for t in node.inputs] if alias else node.inputs
        data = node.op_type not in _SHAPE_OPS and any(is_data.get(t, False) for t in inputs)
        for t in node.outputs:
            is_data[t] = data
        reads = masks.reads(node.op_type, inputs, node.outputs)
        if not data:
            dropped += 1
            continue
        if node.op_type == "Identity":
            alias[node.outputs[0]] = inputs[0]
            continue
        for t in inputs:
            if t and is_data.get(t) and t not in floats and types.get(t, _NO_SHAPE).shape is None:
                valueless = ({v.name for v in graph.input} - data_inputs
                             - {v.name for v in graph.initializer})
                raise _lost_shape(t, nodes, producer, types, valueless)
        j = len(ids)
        seq_index[i] = j
        row, load, node_params = _operator_features(node, inputs, types, params, unknown)
        if fused is not None and node.op_type in VIEWS:  # a view in eager PyTorch: no bytes move
            load[2] = load[3] = load[5] = 0.0
            fused["views"] = fused.get("views", 0) + 1
        rows.append(row)
        loads.append(load)
        ids.append(op_id(node.op_type))
        names.append(scoped.get(node.name) or node.name or f"{node.op_type}_{i}")
        masks.record(names[-1], reads)
        if node.op_type == "Add" and masks.fill.intersection(inputs):
            filled.append(names[-1])
        for t in node_params:
            readers.setdefault(t, []).append(j)
        if node_params and frozen.issuperset(node_params):
            frozen_nodes.append(j)
        for t in inputs:
            p = producer.get(t)
            if p is not None:
                p = seq_index.get(p)
                if p is not None:
                    edges.append((p, j))
    if sum(unknown.values()) == len(ids):  # none, or only unknown ones: nothing to price
        raise ConversionError(f"model '{name or graph.name}': no operator " + (
            f"the converter knows depends on the inputs (only {', '.join(unknown)})" if ids
            else "depends on the inputs (only constants and shape computations)"))
    said = _metadata(model)
    meta = dict(
        format_version=FORMAT_VERSION, vocab_version=VOCAB_VERSION, graph=graph_kind(model),
        inputs={t: list(types[t].shape or []) for t in sorted(data_inputs) if t in types},
        integer_inputs=sorted(t for t in data_inputs
                              if t in types and types[t].elem_type not in FLOAT_TYPES),
        params=int(sum(types[t].numel for t in readers.keys() - tied)),
        **({"frozen": int(sum(types[t].numel for t in (readers.keys() & frozen) - tied)),
            "frozen_nodes": frozen_nodes} if readers.keys() & frozen else {}),
        unknown_ops=dict(sorted(unknown.items())), dropped_nodes=dropped,
        **({"shared_params": r} if (r := sorted({tuple(js) for js in readers.values()
                                                 if len(js) > 1})) else {}),  # ALBERT's layers
        **({} if fused is None else {"fused": fused, "fusion_version": version}),
        **({"fill_operands": filled} if filled else {}),
        **({"half_type": h} if (h := half_of(types, readers.keys())) else {}), **masks.readers,
        **{k: json.loads(said[key]) for k, key in JSON_KEYS.items() if said.get(key)},
        **({"eager_attention": a} if (a := said.get(EAGER_KEY)) else {}),
        **({"checkpointed": True} if said.get(CHECKPOINTED_KEY) else {}),
        **({"sdpa_softmax": _sdpa_softmax(nodes, seq_index, sdpa)}
           if (sdpa := said.get(SDPA_KEY)) is not None else {}),
        **({"linear_attention": a} if (a := said.get(LINEAR_KEY)) else {}),
        **({"sparse_attention": int(top)} if (top := said.get(SPARSE_KEY)) else {}),
    )
    edge_array = np.unique(np.asarray(edges, np.int32).reshape(-1, 2), axis=0)
    return OperatorSequence(name=name or graph.name, op_type=np.asarray(ids, np.int32),
        config=np.asarray(rows, np.float32), load=np.asarray(loads, np.float32),
        edges=edge_array.reshape(-1, 2), node_names=np.asarray(names), meta=meta)


def _operator_features(node: _Node, inputs: list[str], types: dict[str, _Tensor],
                       params: set[str], unknown: dict[str, int]) -> tuple[list, list, list]:
    """Configuration row `[C]`, load `[L]` and parameter tensors of one compute node."""
    ins = [types.get(t, _NO_SHAPE) if t else _NO_SHAPE for t in inputs]
    outs = [types.get(t, _NO_SHAPE) if t else _NO_SHAPE for t in node.outputs]
    state = STATE_INPUTS.get(node.op_type, ())
    is_param = [t in params and k not in state for k, t in enumerate(inputs)]
    view = NodeView(op_type=node.op_type, name=node.name, proto=node.proto,
                    in_shapes=[x.shape for x in ins], out_shapes=[x.shape for x in outs],
                    in_is_param=is_param)
    handler = HANDLERS.get(node.op_type)
    if handler is None:
        unknown[node.op_type] = unknown.get(node.op_type, 0) + 1
        flops, bwd_factor, extra = 0.0, 1.0, None
    else:
        try:
            flops, bwd_factor, extra = handler(view)
        except ConversionError:  # the handler named the problem itself
            raise
        except (TypeError, IndexError, ValueError, KeyError, ZeroDivisionError) as e:
            raise ConversionError(
                f"node '{node.name}' ({node.op_type}): cannot compute its cost from input "
                f"shapes {view.in_shapes} and output shapes {view.out_shapes} "
                f"({type(e).__name__}: {e})") from None

    row = _DEFAULT_ROW.copy()
    known_in = [x for x in ins if x.shape is not None]
    row[0] = len(known_in)  # n_inputs
    row[1] = sum(x.shape is not None for x in outs)  # n_outputs
    if known_in:
        row[_IN_SHAPE:_IN_SHAPE + 5] = _shape_fields(known_in[0].shape or ())
        row[_CFG["in_numel"]] = known_in[0].numel
    out0 = outs[0] if outs else _NO_SHAPE
    if out0.shape is not None:
        row[_OUT_SHAPE:_OUT_SHAPE + 5] = _shape_fields(out0.shape)
        row[_CFG["out_numel"]] = out0.numel
    row[_CFG["elem_bytes"]] = _ELEM_BYTES.get(out0.elem_type, 4)
    node_params = [t for t, p in zip(inputs, is_param) if p]
    row[_CFG["n_param_inputs"]] = len(node_params)
    if extra:
        for key, value in extra.items():
            row[_CFG[key]] = value
    read, written = float(sum(x.nbytes for x in ins)), float(sum(x.nbytes for x in outs))
    n_params = float(sum(x.numel for x, p in zip(ins, is_param) if p))
    intensity = flops / max(read + written, 1.0)
    return row, [flops, bwd_factor * flops, read, written, n_params, intensity], node_params
