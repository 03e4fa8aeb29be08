"""An inference export read as the training step it stands for.

Exporters drop or fold the work that only training does (`converters.kind`); what can be put
back from the graph itself is, by rule:
- a BatchNormalization in inference mode runs in training mode (batch statistics, running
  statistics as outputs: `training_mode=1` from opset 14, the five outputs before);
- a Conv with BatchNormalization folded into it loses the folded bias and is followed by a
  BatchNormalization in training mode over its output channels, whose scale, bias and
  running statistics are weights [C] (what a training export of the same model holds);
- Dropout that the exporter removed cannot be put back (where it was is not in the graph),
  and neither can folding that leaves no trace (a model without BatchNormalization).
What was restored is recorded in the model metadata (`RESTORED_KEY`, JSON) and reported by
`converters.kind.graph_kind` with the graph's kind as exported.
"""

from __future__ import annotations

import json

import onnx
from onnx import helper

from converters.kind import RESTORED_KEY, folded_convs, graph_kind
from converters.sequence import PARAMS_KEY


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _channels(graph: onnx.GraphProto, weight: str) -> int | None:
    """Output channels of a Conv from its weight's shape [C_out, C_in / g, k...]."""
    for t in graph.initializer:
        if t.name == weight:
            return int(t.dims[0]) if t.dims else None
    for vi in graph.input:
        if vi.name == weight:
            dims = vi.type.tensor_type.shape.dim
            return int(dims[0].dim_value) if dims and dims[0].HasField("dim_value") else None
    return None


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
    for i, node in enumerate(graph.node):
        channels = _channels(graph, node.input[1]) if i in folded else None
        nodes.append(node)
        if channels is None:
            continue
        y = node.output[0]
        del node.input[2:]  # the folded bias: a training export's Conv before BN has none
        node.output[0] = f"{y}__before_batchnorm"
        stats = [f"{y}__bn_{w}" for w in ("scale", "bias", "mean", "var")]
        graph.input.extend(helper.make_tensor_value_info(s, onnx.TensorProto.FLOAT, [channels])
                           for s in stats)
        bn = helper.make_node("BatchNormalization", [node.output[0], *stats], [y],
                              name=f"{node.name or y}/restored_batchnorm")
        _train(bn, opset)
        nodes.append(bn)
        restored += stats
    del graph.node[:]
    graph.node.extend(nodes)
    params = next((p for p in out.metadata_props if p.key == PARAMS_KEY), None)
    if params is not None and restored:  # the weights now include the restored ones
        params.value = ",".join(filter(None, [params.value, *restored]))
    out.metadata_props.add(key=RESTORED_KEY, value=json.dumps(dict(
        exported=before["kind"], batchnorm_to_training=len(inference),
        batchnorm_unfolded=len(restored) // 4)))
    return out
