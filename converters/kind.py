"""What kind of graph came in: a training or an inference export, its producer and opset, the
precision of its weights, and control flow that the cost handlers do not look into.

A training step runs more than inference: BatchNormalization computes batch statistics and
updates its running ones, Dropout draws masks. Exporters drop or fold both in inference graphs
(`model.eval()` exports, torch's dynamo exporter folds BatchNormalization into Conv, tf2onnx
exports inference), so such a graph priced as a training graph comes out too fast. The
evidence, by rule:
- `training`: a BatchNormalization in training mode (`training_mode=1`, or running statistics
  as extra outputs, as before opset 14), or a Dropout whose `training_mode` input is set;
- `inference`: BatchNormalization nodes, none of them in training mode, or BatchNormalization
  folded into Conv: a node that the exporter's rewriter records as fused from one (torch's
  dynamo exporter, `FuseBatchNormIntoConv`), or a Conv whose weight is an anonymous folded
  constant (`onnx::Conv_*`) among named module parameters (TorchScript `eval()` exports),
  or a Conv whose bias is TensorFlow's BatchNormalization shift (`<layer>/batchnorm/sub`,
  tf2onnx); or a BatchNormalization that TensorFlow lowered to `x * scale + shift`
  (`<layer>/batchnorm/mul_1` then `<layer>/batchnorm/add_1`, tf2onnx, where it does not fold);
- `unknown`: neither (e.g. a Transformer without Dropout looks the same both ways).
"""

from __future__ import annotations

import json
import math
from collections import Counter

import onnx

KINDS = ("training", "inference", "unknown")
RESTORED_KEY = "mdot.restored"  # model metadata: what `converters.training_view` put back
LOSS_KEY = "mdot.no_loss"  # model metadata: a language model's logits without a loss, and
# whether `training_view.with_loss` gave them one
LOSSES = ("SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss", "CTCLoss")  # loss operators
CONTROL_FLOW = ("Loop", "If", "Scan")
WEIGHT_MIN = 64  # elements: smaller float tensors are constants, not weights
QUANTIZED = ("QLinearConv", "QLinearMatMul", "QuantizeLinear", "DequantizeLinear",
             "ConvInteger", "MatMulInteger", "DynamicQuantizeLinear")
_FLOAT_TYPES = {onnx.TensorProto.FLOAT: "fp32", onnx.TensorProto.FLOAT16: "fp16",
                onnx.TensorProto.BFLOAT16: "bf16", onnx.TensorProto.DOUBLE: "fp64"}


def _bn_training(node: onnx.NodeProto) -> bool:
    mode = next((a.i for a in node.attribute if a.name == "training_mode"), 0)
    return bool(mode) or sum(bool(o) for o in node.output) > 1


def folded_convs(graph: onnx.GraphProto) -> list[int]:
    """Indices of the Conv nodes with BatchNormalization folded in, by the exporters' traces
    (module docs)."""
    names = [t.name for t in graph.initializer] + [i.name for i in graph.input]
    named_params = any("." in n and not n.startswith("onnx::") for n in names)
    out = []
    for i, node in enumerate(graph.node):
        if node.op_type != "Conv":
            continue
        rules = " ".join(p.value for p in node.metadata_props
                         if p.key.endswith("rewriter.rule_name"))
        anonymous = len(node.input) > 1 and node.input[1].startswith("onnx::Conv")
        tf_shift = len(node.input) > 2 and "batchnorm/sub" in node.input[2]
        if "FuseBatchNorm" in rules or (named_params and anonymous) or tf_shift:
            out.append(i)
    return out


def lowered_batchnorms(graph: onnx.GraphProto) -> list[tuple[int, int]]:
    """(Mul, Add) node indices of each BatchNormalization in inference mode that TensorFlow
    lowered to `x * scale + shift` (module docs): the Mul feeds only the Add."""
    producer = {o: i for i, n in enumerate(graph.node) for o in n.output}
    readers = Counter(x for n in graph.node for x in n.input)
    pairs = []
    for j, add in enumerate(graph.node):
        if add.op_type != "Add" or not add.name.endswith("batchnorm/add_1"):
            continue
        for x in add.input:
            i = producer.get(x, -1)
            mul = graph.node[i] if i >= 0 else None
            if mul is not None and mul.op_type == "Mul" and \
                    mul.name.endswith("batchnorm/mul_1") and readers[x] == 1:
                pairs.append((i, j))
                break
    return pairs


def graph_kind(model: onnx.ModelProto) -> dict:
    """`kind` (KINDS) with its evidence, `producer`, `opset`, `precision` of the float weights
    (fp32 / fp16 / bf16 / mixed, or int8 when quantized operators are present) and the
    `control_flow` operators present (their bodies are not costed)."""
    graph = model.graph
    ops = Counter(n.op_type for n in graph.node)
    bn = [n for n in graph.node if n.op_type == "BatchNormalization"]
    bn_train = sum(_bn_training(n) for n in bn)
    dropout_train = sum(n.op_type == "Dropout" and len(n.input) > 2 and bool(n.input[2])
                        for n in graph.node)
    folded = len(folded_convs(graph))
    lowered = len(lowered_batchnorms(graph))
    if bn_train or dropout_train:
        kind = "training"
    elif bn or folded or lowered:
        kind = "inference"
    else:
        kind = "unknown"
    # weights: initializers and graph inputs of at least WEIGHT_MIN elements (not the scalar
    # constants that exporters store in whatever type, nor symbolic-shaped data inputs)
    floats = Counter(_FLOAT_TYPES[t.data_type] for t in graph.initializer
                     if t.data_type in _FLOAT_TYPES and math.prod(t.dims) >= WEIGHT_MIN)
    for i in graph.input:
        t = i.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else 0 for d in t.shape.dim]
        if t.elem_type in _FLOAT_TYPES and math.prod(dims) >= WEIGHT_MIN:
            floats[_FLOAT_TYPES[t.elem_type]] += 1
    precision = "int8" if any(ops[q] for q in QUANTIZED) else (
        "mixed" if len(floats) > 1 else next(iter(floats), "fp32"))
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    restored = next((json.loads(p.value) for p in model.metadata_props
                     if p.key == RESTORED_KEY), None)
    loss = next((json.loads(p.value) for p in model.metadata_props if p.key == LOSS_KEY), None)
    if restored:  # `converters.training_view` read an inference export as a training one
        kind = restored.pop("exported")
        bn_train -= restored["batchnorm_to_training"] + restored["batchnorm_unfolded"]
        bn = bn[:len(bn) - restored["batchnorm_unfolded"]]
        folded = restored["batchnorm_unfolded"]
    return dict(kind=kind, batchnorm_training=bn_train,
                batchnorm_inference=len(bn) - bn_train + lowered,
                batchnorm_folded=folded,
                dropout_training=dropout_train, producer=" ".join(
                    p for p in (model.producer_name, model.producer_version) if p),
                opset=int(opset), precision=precision,
                control_flow={op: ops[op] for op in CONTROL_FLOW if ops[op]},
                **({"restored": restored} if restored else {}),
                **({"no_loss": loss} if loss else {}))
