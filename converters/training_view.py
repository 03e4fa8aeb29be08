"""An inference export read as the training step it stands for.

Exporters drop or fold the work that only training does (`converters.kind`); what can be put
back from the graph itself is, by rule:
- a BatchNormalization in inference mode runs in training mode (batch statistics, running
  statistics as outputs: `training_mode=1` from opset 14, the five outputs before);
- a Conv with BatchNormalization folded into it loses the folded bias and is followed by a
  BatchNormalization in training mode over its output channels, whose scale, bias and
  running statistics are weights [C] (what a training export of the same model holds);
- a BatchNormalization lowered to `x * scale + shift` (TensorFlow) is one again, in training
  mode, with weights [C] as above;
- the weights that no operator reads any more (the folded biases, the lowered scales and
  shifts) leave the graph;
- Dropout that the exporter removed cannot be put back (where it was is not in the graph),
  and neither can folding that leaves no trace (a model without BatchNormalization).
What was restored is recorded in the model metadata (`RESTORED_KEY`, JSON) and reported by
`converters.kind.graph_kind` with the graph's kind as exported.

A language model exported without its labels ends at its logits: a graph with no loss (no
loss operator, no output of rank 0 or 1) one of whose outputs is [B, T, V], V the rows of the
table its token input (a rank-2 integer data input) is looked up in, is given the loss a
language model trains on (`lm_logits` finds them, `with_loss` adds it): the logits in fp32,
a cross-entropy over the V classes of every position, its mean, as transformers computes it
(the loss of a config.json's model); the labels' values are not read. The loader records what
it found as `LOSS_KEY` (the logits' output and V, whether the loss was added; and the tokens a
sequence has where the logits are of one position of them: an inference forward, nanoGPT's
without targets, whose head is the last position's alone).
"""

from __future__ import annotations

import json
import math

import onnx
from onnx import helper

from converters.kind import (
    LOSS_KEY,
    LOSSES,
    RESTORED_KEY,
    folded_convs,
    graph_kind,
    lowered_batchnorms,
)
from converters.sequence import PARAMS_KEY
from converters.tensors import token_inputs


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _dims(graph: onnx.GraphProto, name: str) -> list[int] | None:
    """The fixed shape of a weight (an initializer or a graph input), or None."""
    for t in graph.initializer:
        if t.name == name:
            return list(t.dims)
    for vi in graph.input:
        if vi.name == name:
            dims = vi.type.tensor_type.shape.dim
            return [int(d.dim_value) for d in dims] if all(
                d.HasField("dim_value") for d in dims) else None
    return None


def _channels(graph: onnx.GraphProto, weight: str) -> int | None:
    """Output channels of a Conv from its weight's shape [C_out, C_in / g, k...]."""
    dims = _dims(graph, weight)
    return dims[0] if dims else None


def _batchnorm(x: str, y: str, channels: int, name: str, graph: onnx.GraphProto,
               opset: int) -> tuple[onnx.NodeProto, list[str]]:
    """A BatchNormalization in training mode from `x` to `y` over `channels`, with its
    weights [C] added as graph inputs; returns it and their names."""
    stats = [f"{y}__bn_{w}" for w in ("scale", "bias", "mean", "var")]
    graph.input.extend(helper.make_tensor_value_info(s, onnx.TensorProto.FLOAT, [channels])
                       for s in stats)
    bn = helper.make_node("BatchNormalization", [x, *stats], [y], name=name)
    _train(bn, opset)
    return bn, stats


def _train(bn: onnx.NodeProto, opset: int) -> None:
    """Sets BatchNormalization `bn` to training mode: the running statistics as outputs, and
    `training_mode=1` from opset 14 (the saved statistics as outputs before)."""
    y = bn.output[0]
    del bn.output[1:]
    bn.output.extend([f"{y}__running_mean", f"{y}__running_var"])
    kept = [a for a in bn.attribute if a.name != "training_mode"]
    del bn.attribute[:]
    bn.attribute.extend(kept)
    if opset >= 14:
        bn.attribute.append(helper.make_attribute("training_mode", 1))
    else:
        bn.output.extend([f"{y}__saved_mean", f"{y}__saved_var"])


def as_training(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` itself if it is no inference export; otherwise a copy with the training work
    that the graph still shows put back (module docs)."""
    before = graph_kind(model)
    if before["kind"] != "inference":
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph, opset = out.graph, _opset(out)
    inference = [n for n in graph.node
                 if n.op_type == "BatchNormalization" and len([o for o in n.output if o]) == 1]
    for bn in inference:
        _train(bn, opset)
    nodes, folded, restored = [], set(folded_convs(graph)), []
    detached: set[str] = set()  # weights that the restored operators no longer read
    lowered = dict(lowered_batchnorms(graph))  # Mul index -> Add index
    dropped, unlowered = set(lowered.values()), 0
    for i, node in enumerate(graph.node):
        if i in dropped:
            continue
        if i in lowered:  # x * scale + shift: the BatchNormalization it was
            add = graph.node[lowered[i]]
            scale = next((w for w in node.input if _dims(graph, w)), None)
            dims = _dims(graph, scale) if scale else None
            if dims is None or math.prod(dims) <= 1:
                nodes += [node, add]  # not a per-channel weight: left as it is
                continue
            x = next(v for v in node.input if v != scale)
            detached.update(w for w in (*node.input, *add.input) if w != x and w != node.output[0])
            bn, stats = _batchnorm(x, add.output[0], math.prod(dims),
                                   add.name.rsplit("/", 1)[0] or add.output[0], graph, opset)
            nodes.append(bn)
            restored += stats
            unlowered += 1
            continue
        channels = _channels(graph, node.input[1]) if i in folded else None
        nodes.append(node)
        if channels is None:
            continue
        y = node.output[0]
        detached.update(node.input[2:])
        del node.input[2:]  # the folded bias: a training export's Conv before BN has none
        node.output[0] = f"{y}__before_batchnorm"
        bn, stats = _batchnorm(node.output[0], y, channels,
                               f"{node.name or y}/restored_batchnorm", graph, opset)
        nodes.append(bn)
        restored += stats
    del graph.node[:]
    graph.node.extend(nodes)
    read = {x for n in graph.node for x in n.input} | {o.name for o in graph.output}
    for field in (graph.input, graph.initializer):  # weights no operator reads any more
        kept = [t for t in field if t.name in read or t.name not in detached]
        del field[:]
        field.extend(kept)
    params = next((p for p in out.metadata_props if p.key == PARAMS_KEY), None)
    if params is not None and (restored or detached):  # the weights as they are now
        params.value = ",".join([n for n in params.value.split(",") if n and n not in detached]
                                + restored)
    out.metadata_props.add(key=RESTORED_KEY, value=json.dumps(dict(
        exported=before["kind"], batchnorm_to_training=len(inference) + unlowered,
        batchnorm_unfolded=len(restored) // 4 - unlowered)))
    return out


_VIEWS = ("Reshape", "Cast", "Identity", "Unsqueeze", "Squeeze", "Flatten")  # of tokens


def lm_logits(model: onnx.ModelProto) -> dict | None:
    """Where `model` has no loss and ends at a language model's logits (module docs): their
    output (`logits`), classes (V) and, where they are of one position of each sequence, its
    tokens (`one_of`); else None."""
    graph = model.graph
    if _opset(model) < 13 or any(n.op_type in LOSSES for n in graph.node) or any(
            len(o.type.tensor_type.shape.dim) < 2 for o in graph.output):
        return None
    made = {o: n for n in graph.node for o in n.output}
    inputs = token_inputs(graph)
    tokens = {i.name for i in inputs}

    def token(t: str) -> bool:  # the token input, or a view of it
        for _ in range(8):
            if t in tokens or t not in made or made[t].op_type not in _VIEWS or \
                    not made[t].input:
                break
            t = made[t].input[0]
        return t in tokens

    looked_up = {n.input[0] for n in graph.node
                 if n.op_type == "Gather" and len(n.input) > 1 and token(n.input[1])}
    rows = {d[0] for w in looked_up if (d := _dims(graph, w)) and len(d) == 2}
    logits = next((o for o in graph.output if len(dims := o.type.tensor_type.shape.dim) == 3
                   and dims[2].HasField("dim_value") and dims[2].dim_value in rows), None)
    if logits is None:
        return None
    length = max((i.type.tensor_type.shape.dim[1].dim_value for i in inputs),
                 default=0)  # a sequence's tokens, where fixed
    dims = logits.type.tensor_type.shape.dim
    return dict(logits=logits.name, classes=dims[2].dim_value,
                **({"one_of": length} if dims[1].dim_value == 1 < length else {}))


def with_loss(model: onnx.ModelProto, found: dict, add: bool = True) -> onnx.ModelProto:
    """A copy of `model` whose logits output (`found`: `lm_logits`') is replaced by their
    loss (module docs); not `add`: `model` itself. Either records `found` (`LOSS_KEY`, in
    place where not added: the loader's own copy)."""
    said = onnx.StringStringEntryProto(key=LOSS_KEY, value=json.dumps(dict(found, added=add)))
    if not add:
        model.metadata_props.append(said)
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.metadata_props.append(said)
    graph, x, vocabulary = out.graph, found["logits"], found["classes"]
    const = lambda name, v: helper.make_node("Constant", [], [name], value=(  # noqa: E731
        helper.make_tensor(name, onnx.TensorProto.INT64, [len(v)], v)))
    graph.node.extend([
        helper.make_node("Shape", [x], [f"{x}__shape"]), const(f"{x}__0", [0]),
        const(f"{x}__2", [2]),  # [B, T]: the labels' shape (Slice: Shape's end is opset 15's)
        helper.make_node("Slice", [f"{x}__shape", f"{x}__0", f"{x}__2"], [f"{x}__bt"]),
        helper.make_node("ConstantOfShape", [f"{x}__bt"], [f"{x}__labels"],
                         value=helper.make_tensor("zero", onnx.TensorProto.INT64, [1], [0])),
        const(f"{x}__rows", [-1]), const(f"{x}__classes", [-1, vocabulary]),
        helper.make_node("Reshape", [f"{x}__labels", f"{x}__rows"], [f"{x}__flat_labels"]),
        helper.make_node("Cast", [x], [f"{x}__fp32"], to=onnx.TensorProto.FLOAT),
        helper.make_node("Reshape", [f"{x}__fp32", f"{x}__classes"], [f"{x}__flat"]),
        helper.make_node("SoftmaxCrossEntropyLoss", [f"{x}__flat", f"{x}__flat_labels"],
                         [f"{x}__loss"], name="added_loss", reduction="mean")])
    at = next(i for i, o in enumerate(graph.output) if o.name == x)
    graph.output.remove(graph.output[at])
    graph.output.insert(at, helper.make_tensor_value_info(f"{x}__loss", onnx.TensorProto.FLOAT,
                                                          []))
    return out
