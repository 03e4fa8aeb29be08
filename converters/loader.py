"""Load an ONNX model weight-free, make its input dims concrete and re-infer every shape.

One export serves every workload: the data inputs' batch size, image size and sequence length
are set here from arguments, all stale intermediate shapes are stripped and ONNX shape
inference runs again (strict, with data propagation so Reshape targets computed from `Shape`
resolve).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Union

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto, helper, numpy_helper

from converters.checks import refuse_sliced_positions
from converters.dims import baked, check_dims, concretise, head_of
from converters.errors import ConversionError
from converters.masks import FILLS_KEY, PADDING_KEY, folded
from converters.selected import folding, sized
from converters.sequence import (
    DATA_INPUTS_KEY,
    JSON_KEYS,
    PARAMS_KEY,
    SDPA_KEY,
    SPARSE_KEY,
    TIED_KEY,
    OperatorSequence,
    data_input_names,
    to_sequence,
)
from converters.state_space import define_own_ops
from converters.tensors import FLOAT_TYPES
from converters.training_view import as_training, lm_logits, with_loss

ModelSource = Union[str, Path, bytes, onnx.ModelProto]
KEEP_INITIALIZER_MAX = 64  # keep values of small initializers (shape constants for Reshape)


def read_model(source: ModelSource) -> onnx.ModelProto:
    """Parses an ONNX file (external data is never loaded) or passes a ModelProto through."""
    if isinstance(source, onnx.ModelProto):
        return source
    label, data = ("<bytes>", source) if isinstance(source, bytes) else (str(source), b"")
    if not isinstance(source, bytes):
        path = Path(source)
        if path.is_dir():
            onnx_files = sorted(p.name for p in path.glob("*.onnx"))[:3]
            raise ConversionError(f"{path}: is a directory; give an .onnx file" + (
                f" (it holds {', '.join(onnx_files)}{', ...' if len(onnx_files) == 3 else ''})"
                if onnx_files else ""))
        if not path.exists():
            raise ConversionError(f"{path}: no such file")
        if not path.is_file():  # /dev/zero, a pipe: endless or not there to read twice
            raise ConversionError(f"{path}: not a regular file; give an .onnx file")
        try:
            data = path.read_bytes()
        except OSError as e:
            raise ConversionError(f"{path}: cannot read it ({e.strerror or e})") from None
    if not data:
        raise ConversionError(f"{label}: empty file, not an ONNX model")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise ConversionError(f"{label}: not an ONNX model or truncated file "
                              f"(protobuf parse failed: {e})") from None
    if model.ir_version <= 0 or not model.HasField("graph"):
        raise ConversionError(f"{label}: not an ONNX model (no IR version or no graph)")
    if damage := _damaged_field(model):
        raise ConversionError(f"{label}: a damaged ONNX file ({damage})")
    return model


_TENSOR_TYPES = frozenset(onnx.TensorProto.DataType.values()) - {onnx.TensorProto.UNDEFINED}


def _damaged_field(model: onnx.ModelProto) -> str | None:
    """What a file damaged in place leaves that parses but cannot be read: a name that is not
    UTF-8 text (protobuf hands such a string over as bytes), an unknown tensor type, or an
    exporter's JSON metadata that is not JSON."""
    g = model.graph
    named = [("metadata", p.key) for p in model.metadata_props]
    named += [("metadata", p.value) for p in model.metadata_props]
    for n in g.node:
        named += [("node", x) for x in (n.name, n.op_type, n.domain, *n.input, *n.output)]
    for t in g.initializer:
        if t.data_type not in _TENSOR_TYPES:
            return f"initializer {t.name!r} has tensor type {t.data_type}"
        named.append(("initializer", t.name))
    for v in (*g.input, *g.output, *g.value_info):
        if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type not in _TENSOR_TYPES:
            return f"value {v.name!r} has tensor type {v.type.tensor_type.elem_type}"
        named.append(("value", v.name))
    what, text = next(((w, x) for w, x in named if not isinstance(x, str)), ("", ""))
    if what:
        return f"a {what} name is not text: {text!r:.40}"
    for p in model.metadata_props:  # what an exporter wrote as JSON or numbers (`to_sequence`)
        if p.key in JSON_KEYS.values():
            try:
                json.loads(p.value)
            except ValueError:
                return f"metadata {p.key!r} is not JSON: {p.value!r:.40}"
        elif p.key in (SDPA_KEY, SPARSE_KEY) and not all(
                k.isdigit() for k in p.value.split(",") if k):
            return f"metadata {p.key!r} is not a list of numbers: {p.value!r:.40}"
    return None


def _strip_weights(model: onnx.ModelProto) -> None:
    """Large initializers become shaped graph inputs: the graph keeps shapes, not values."""
    graph = model.graph
    existing = {i.name for i in graph.input}
    keep = []
    for init in graph.initializer:
        n = 1
        for d in init.dims:
            n *= d
        if n <= KEEP_INITIALIZER_MAX and init.data_location != TensorProto.EXTERNAL:
            keep.append(init)
            continue
        if init.name not in existing:
            graph.input.append(helper.make_tensor_value_info(init.name, init.data_type,
                                                             list(init.dims)))
    del graph.initializer[:]
    graph.initializer.extend(keep)


def _weight_names(graph: onnx.GraphProto, data: set[str], masks: set[str]) -> list[str]:
    """Float initializers and non-data graph inputs of rank >= 1 (scalars are constants; nor
    are the folded `masks`)."""
    names = [t.name for t in graph.initializer if t.data_type in FLOAT_TYPES and len(t.dims)
             and t.name not in masks]
    data = data | masks
    names += [i.name for i in graph.input if i.name not in data
              and i.type.tensor_type.elem_type in FLOAT_TYPES
              and len(i.type.tensor_type.shape.dim)]
    return names


def _tied_copies(graph: onnx.GraphProto) -> list[str]:
    """Initializers holding the same values as an earlier one, up to a transpose (a tied
    embedding and its output projection after constant folding): the later names."""
    groups: dict[tuple, list[tuple[str, np.ndarray]]] = {}
    for init in graph.initializer:
        n = int(np.prod(init.dims))
        if n <= KEEP_INITIALIZER_MAX or init.data_location == TensorProto.EXTERNAL:
            continue
        values = numpy_helper.to_array(init).ravel()
        low, high = values.min().item(), values.max().item()
        if low != high:  # a constant fill (norm scales at init) is no evidence of tying
            groups.setdefault((n, init.data_type, low, high), []).append((init.name, values))
    copies = []
    for group in groups.values():  # the same size and range: compare the sorted values
        kept: list[np.ndarray] = []
        for name, values in group if len(group) > 1 else ():
            ordered = np.sort(values)
            if any(np.array_equal(ordered, other) for other in kept):
                copies.append(name)
            else:
                kept.append(ordered)
    return copies


def _set_meta(model: onnx.ModelProto, key: str, value: str) -> None:
    for p in model.metadata_props:
        if p.key == key:
            p.value = value
            return
    model.metadata_props.add(key=key, value=value)


def _infers(model: onnx.ModelProto, label: str, input_shapes=None, batch_size=None,
            image_size=None, seq_len=None) -> bool:
    """Whether shape inference succeeds with these dims (those not given as exported)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    try:
        concretise(copy, input_shapes or {}, batch_size, image_size, seq_len, label)
        shaped(copy, label)
    except ConversionError:
        return False
    return True


def load_model(source: ModelSource, *, input_shapes: Mapping[str, Sequence[int]] | None = None,
               batch_size: int | None = None, image_size: int | None = None,
               seq_len: int | None = None, label: str | None = None,
               loss: bool = False) -> onnx.ModelProto:
    """Reads `source`, strips weights, sets concrete input dims and re-infers all shapes.

    Args:
      source: `.onnx` path, serialized bytes or a ModelProto (not modified).
      input_shapes: data input name -> full concrete shape; wins over the other arguments.
      batch_size: dim 0 of every data input.
      image_size: the two spatial dims of rank-4 data inputs (NCHW or NHWC).
      seq_len: dim 1 of rank-2 integer data inputs (token ids).
      label: what errors call the model (default: its path, or "<model>").
      loss: a language model's logits given their loss where the graph has none
        (`training_view.with_loss`: what a spec sheet prices; a checkpoint was trained on
        graphs as exported).
    Returns:
      A new ModelProto with every tensor shape concrete (`value_info` filled).
    Raises:
      ConversionError: unreadable file, symbolic dims left, or shape inference failure.
    """
    check_dims(batch_size=batch_size, image_size=image_size, seq_len=seq_len)
    label = label or ("<model>" if isinstance(source, (bytes, onnx.ModelProto)) else str(source))
    original = read_model(source)
    model = onnx.ModelProto()
    model.CopyFrom(original)
    define_own_ops(model)  # our exporter's nodes, for shape inference (once, not each round)
    if len(model.graph.node) == 0:
        raise ConversionError(f"{label}: the graph is empty (no nodes)")
    model = as_training(model)  # an inference export, read as its training step
    if logits := lm_logits(model):  # a language model's logits, no loss: given it, or said
        model = with_loss(model, logits, add=loss)
    data = data_input_names(model)
    _set_meta(model, DATA_INPUTS_KEY, ",".join(data))
    meta = {p.key for p in model.metadata_props}
    held = head_of(model).get("images")  # a grid encoder's, an audio's masked frames
    if held and batch_size and batch_size != held:
        raise ConversionError(f"{label}: the graph holds the images or audio of a batch of "
                              f"{held} (their sizes are in it): convert it at batch {held}, or "
                              f"export it again at batch {batch_size} (from_hf_config(..., "
                              f"images={batch_size}))")
    base = None if isinstance(source, (bytes, onnx.ModelProto)) else Path(source).parent
    masks = {t.name: kind for t in model.graph.initializer if (kind := folded(t, base))}
    for kind, key in (("fill", FILLS_KEY), ("padding", PADDING_KEY)):
        if found := [t for t, k in masks.items() if k == kind]:  # (a stripped file keeps its)
            _set_meta(model, key, ",".join(found))
    if PARAMS_KEY not in meta:  # the weights as exported, before folding adds constants
        _set_meta(model, PARAMS_KEY, ",".join(_weight_names(model.graph, set(data), set(masks))))
    if TIED_KEY not in meta:
        _set_meta(model, TIED_KEY, ",".join(_tied_copies(model.graph)))
    _strip_weights(model)
    exported = onnx.ModelProto()
    exported.CopyFrom(model)
    changed = concretise(model, input_shapes or {}, batch_size, image_size, seq_len, label)
    del model.graph.value_info[:]
    for out in model.graph.output:
        out.type.tensor_type.ClearField("shape")
    try:
        model = shaped(model, label)
    except ConversionError:
        batches = {name: {0: dims[0]} for name, dims in changed.items() if 0 in dims}
        sizes = {name: moved for name, dims in changed.items()
                 if (moved := {k: d for k, d in dims.items() if k})}
        for culprit, given in ((batches, dict(image_size=image_size, seq_len=seq_len)),
                               (sizes, dict(batch_size=batch_size)), (changed, {})):
            if culprit and _infers(exported, label, input_shapes, **given):
                refuse_sliced_positions(model, Path(label).stem if base else label)  # not
                # the size it was exported at: too few positions
                raise ConversionError(baked(label, culprit, exported)) from None
        raise
    return model


def shaped(model: onnx.ModelProto, label: str) -> onnx.ModelProto:
    """`model` with every shape inferred: what data propagation could not resolve folded, and
    sized what the data decides."""
    model = _infer(model, label)
    for _ in range(MAX_FOLD_ROUNDS):
        if not _unknown_shapes(model) or not (
                _fold_shape_computations(model) or _decided_branches(model)
                or sized(model, concrete_shapes(model.graph), label)):
            break
        model = _infer(model, label)
    return model


# Shape arithmetic yields small tensors; a constant subgraph with a larger output (convit's
# attention-position tensors grow with the batch, past protobuf's 2 GB at batch 512) stays
# in the graph as operators.
FOLD_MAX_ELEMENTS = 1 << 20
MAX_FOLD_ROUNDS = 256  # each round resolves at least one more level of shape arithmetic
_NEVER_FOLD = {"RandomUniform", "RandomUniformLike", "RandomNormal", "RandomNormalLike",
               "Bernoulli", "Multinomial", "If", "Loop", "Scan"}


def _infer(model: onnx.ModelProto, label: str) -> onnx.ModelProto:
    """`model` with its shapes inferred; without data propagation where that fails and the
    shapes hold (it read a detector's [2] and [2002] box areas as shape values): the folding
    rounds give what it would."""
    failed = (onnx.shape_inference.InferenceError, onnx.checker.ValidationError)
    try:
        return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True,
                                                 data_prop=True)
    except failed as e:
        with contextlib.suppress(*failed):
            return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConversionError(f"{label}: shape inference failed: {first}") from None


def concrete_shapes(graph: onnx.GraphProto) -> dict[str, list[int]]:
    out = {}
    for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
        t = vi.type.tensor_type
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            out[vi.name] = [d.dim_value for d in t.shape.dim]
    return out


def _unknown_shapes(model: onnx.ModelProto) -> bool:
    shapes = concrete_shapes(model.graph)
    return any(t and t not in shapes for n in model.graph.node for t in n.output)


def _fold_shape_computations(model: onnx.ModelProto) -> bool:
    """Evaluates, with the ONNX reference evaluator, every node that only computes values from
    constants and concrete shapes (Shape -> Gather -> Div -> Concat -> ...), and replaces those
    nodes by initializers holding their results. Returns whether anything was folded."""
    graph = model.graph
    shapes = concrete_shapes(graph)
    known = {i.name for i in graph.initializer}
    foldable: list[onnx.NodeProto] = []
    outputs: list[str] = []
    from_shape: set[int] = set()  # ids of Shape nodes read from concrete shapes
    for node in graph.node:
        if node.op_type in _NEVER_FOLD or node.domain not in ("", "ai.onnx"):
            continue
        ok = all(not t or t in known for t in node.input)
        if not ok and node.op_type == "Shape" and node.input[0] in shapes:
            ok = True
            from_shape.add(id(node))
        if ok and any(math.prod(shapes.get(t, ())) > FOLD_MAX_ELEMENTS for t in node.output):
            ok = False  # a large tensor computed at run time is work, not shape arithmetic
        if ok:
            foldable.append(node)
            known.update(t for t in node.output if t)
            outputs.extend(t for t in node.output if t)
    if not foldable:
        return False
    sub_nodes = []
    for node in foldable:
        if id(node) in from_shape:  # the input's shape is concrete: a constant
            dims = shapes[node.input[0]]
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            dims = dims[attrs.get("start", 0):attrs.get("end", len(dims))]
            node = helper.make_node("Constant", [], [node.output[0]],
                                    value=numpy_helper.from_array(np.asarray(dims, np.int64)))
        sub_nodes.append(node)
    values = _evaluate(sub_nodes, graph.initializer, model.opset_import)
    if not values:
        return False
    folded = {id(n) for n, node in zip(foldable, sub_nodes) if node.output[0] in values}
    folding(model, folded)
    keep = [n for n in graph.node if id(n) not in folded]
    first: dict[int, str] = {}  # a result `_evaluate` shares (each layer's same index or shape
    alias = {t: first.setdefault(id(v), t) for t, v in values.items()}  # arithmetic): one copy
    for n in _nodes_within(keep):  # (an If's branch reads a folded value by its name too)
        for j, t in enumerate(n.input):
            if alias.get(t, t) != t:
                n.input[j] = alias[t]
    del graph.node[:]
    graph.node.extend(keep)
    graph.initializer.extend(numpy_helper.from_array(np.asarray(values[t]), name=t)
                             for t in first.values())
    del graph.value_info[:]  # stale partial shapes would override the folded values' shapes
    return True


def _nodes_within(nodes: Sequence[onnx.NodeProto]) -> Iterator[onnx.NodeProto]:
    """`nodes` and every node of their subgraphs (an If's branches, a Loop's body), nested."""
    for node in nodes:
        yield node
        for a in node.attribute:
            for g in [a.g] * a.HasField("g") + list(a.graphs):
                yield from _nodes_within(g.node)


def _decided_branches(model: onnx.ModelProto) -> bool:
    """Replaces each `If` whose condition folded to a constant by the branch it takes (the
    exporter's `squeeze(dim)` of a dim whose size it could not tell: Zamba's Mamba), whose
    outputs become the If's. Returns whether any was replaced."""
    graph = model.graph
    consts = {i.name: i for i in graph.initializer}
    names = {t for n in graph.node for t in n.output} | {t.name for t in graph.input} | set(consts)
    nodes: list[onnx.NodeProto] = []
    decided = False
    for node in graph.node:
        cond = consts.get(node.input[0]) if node.op_type == "If" else None
        value = None if cond is None else numpy_helper.to_array(cond)
        if value is None or value.size != 1:
            nodes.append(node)
            continue
        taken = "then_branch" if value.item() else "else_branch"
        branch = next(helper.get_attribute_value(a) for a in node.attribute if a.name == taken)
        made = {t for n in branch.node for t in n.output if t}
        renamed = {t: f"{node.output[0]}/{t}" for t in made if t in names}  # unique names
        for inner in branch.node:
            inlined = onnx.NodeProto()
            inlined.CopyFrom(inner)
            for field in (inlined.input, inlined.output):
                field[:] = [renamed.get(t, t) for t in field]
            nodes.append(inlined)
        nodes.extend(helper.make_node("Identity", [renamed.get(o.name, o.name)], [out])
                     for o, out in zip(branch.output, node.output) if out)
        names |= made | set(renamed.values())
        decided = True
    if decided:
        del graph.node[:]
        graph.node.extend(nodes)
    return decided


# Ops whose reference implementation fails on ordinary inputs (GatherElements: np.choose
# accepts at most 64 choices).
_NUMPY_OPS = {
    "GatherElements": lambda data, indices, axis=0: np.take_along_axis(data, indices, axis),
}


def _numel_bound(node: onnx.NodeProto, args: list) -> float:
    """How many elements evaluating `node` on `args` would make (an upper bound for the ops
    that make tensors from values; the broadcast shape of the inputs for the rest), so that
    a causal mask of a long sequence is never built on the host just to be left unfolded."""
    op = node.op_type
    shapes = [np.shape(a) for a in args if a is not None]
    try:
        if op == "ConstantOfShape":
            return float(np.prod(args[0], dtype=np.float64))
        if op == "Expand":
            return float(np.prod(np.broadcast_shapes(shapes[0], tuple(int(d) for d in args[1])),
                                 dtype=np.float64))
        if op == "Range":
            start, limit, delta = (float(np.asarray(a).reshape(-1)[0]) for a in args[:3])
            return abs(math.ceil((limit - start) / delta)) if delta else math.inf
        if op == "Tile":
            return float(np.size(args[0]) * np.prod(args[1], dtype=np.float64))
        if op == "MatMul":
            return float(np.prod(shapes[0][:-1] or (1,)) * (shapes[1][-1] if shapes[1] else 1))
        if op == "Gather":
            data, indices = args[:2]
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            return float(np.size(indices) * np.size(data) / max(1, np.shape(data)[axis]))
        return float(np.prod(np.broadcast_shapes(*shapes), dtype=np.float64))
    except (ValueError, TypeError, IndexError, OverflowError):
        return float(max((np.size(a) for a in args if a is not None), default=0))


@np.errstate(all="ignore")  # folded as any runtime computes them (T5's log(0) buckets), unsaid
def _evaluate(nodes, initializers, opsets) -> dict[str, np.ndarray]:
    """Runs `nodes` (topologically ordered) node by node with the ONNX reference evaluator,
    leaving out the nodes that fail, those whose outputs would pass `FOLD_MAX_ELEMENTS`
    (`_numel_bound`, checked before they run: host memory stays bounded at any sequence
    length), and what depends on them."""
    from onnx.reference import ReferenceEvaluator

    env = {i.name: numpy_helper.to_array(i) for i in initializers}
    values = {}
    result: Any
    done: dict[tuple, Any] = {}  # (op, attributes, inputs' values) -> outputs: a model's
    for node in nodes:           # layers repeat the same shape arithmetic, evaluated once
        if not all(not t or t in env for t in node.input):
            continue
        args = [env[t] if t else None for t in node.input]
        if _numel_bound(node, args) > FOLD_MAX_ELEMENTS:
            continue
        key = (node.op_type, node.domain, tuple(a.SerializeToString() for a in node.attribute),
               tuple(None if a is None else (np.asarray(a).dtype.str, np.shape(a),
                                             np.asarray(a).tobytes()) for a in args))
        result = done.get(key)
        if result is None:
            try:
                if node.op_type in _NUMPY_OPS:
                    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
                    result = [_NUMPY_OPS[node.op_type](*args, **attrs)]
                else:
                    result = ReferenceEvaluator(node).run(None, {t: env[t] for t in node.input
                                                                 if t})
            except Exception:  # noqa: BLE001 - this node stays; inference reports if it matters
                continue
            done[key] = result
        for t, v in zip(node.output, result):
            if t and np.size(v) <= FOLD_MAX_ELEMENTS:
                env[t] = values[t] = v
    return values


def convert(source: ModelSource, *, name: str = "", fuse: bool | int = False,
            **dims) -> OperatorSequence:
    """`load_model` + `to_sequence`: any ONNX model to its operator sequence.

    `dims` are `load_model`'s keyword arguments (input_shapes, batch_size, image_size, seq_len,
    label);
    `fuse`: see `converters.fusion`.
    """
    if not name and not isinstance(source, (bytes, onnx.ModelProto)):
        name = Path(source).stem
    return to_sequence(load_model(source, **dims), name=name, fuse=fuse)
