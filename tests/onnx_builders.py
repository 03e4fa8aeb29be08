"""Small hand-built ONNX graphs for tests (float32, opset 17)."""

from onnx import TensorProto, helper

F = TensorProto.FLOAT


def value(name, shape, dtype=F):
    return helper.make_tensor_value_info(name, dtype, shape)


def model(nodes, inputs, outputs, initializers=(), name="g"):
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def conv_bn_relu(batch="N", training=False, size=8):
    """x[batch,3,size,size] -> Conv(4, 3x3, pad 1) -> BN -> Relu -> y; BN in training mode
    (batch statistics, running statistics as outputs: a training export) or inference mode."""
    bn_out = ["n", "rm", "rv"] if training else ["n"]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", kernel_shape=[3, 3],
                         pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], bn_out, name="bn",
                         training_mode=int(training)),
        helper.make_node("Relu", ["n"], ["y"], name="relu"),
    ]
    inputs = [value("x", [batch, 3, size, size]), value("w", [4, 3, 3, 3])] + \
        [value(k, [4]) for k in "sbmv"]
    m = model(nodes, inputs, [value("y", None)])
    m.metadata_props.add(key="mdot.data_inputs", value="x")
    return m


def token_embedding(batch="N", seq="T"):
    """ids[batch, seq] (int64) -> Gather from a table [100, 8] -> y: a text model's first
    operator."""
    nodes = [helper.make_node("Gather", ["table", "ids"], ["y"], name="embed")]
    inputs = [value("ids", [batch, seq], TensorProto.INT64), value("table", [100, 8])]
    m = model(nodes, inputs, [value("y", None)])
    m.metadata_props.add(key="mdot.data_inputs", value="ids")
    return m


def attention(batch="N", seq=8, dim=16, heads=1):
    """x[batch, seq, dim] -> q = x Wq, k = x Wk (Wk transposed on the way, as exporters do),
    softmax(q k^T) x, then LayerNorm: one attention head's GEMMs, batched GEMMs and rows;
    `heads` > 1: q, k and x split into [batch, heads, seq, dim / heads] (and merged after)."""
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"], name="q"),
        helper.make_node("Transpose", ["wk"], ["wkt"], name="wk_t", perm=[1, 0]),
        helper.make_node("MatMul", ["x", "wkt"], ["k"], name="k"),
    ]
    inputs = [value("x", [batch, seq, dim]), value("wq", [dim, dim]), value("wk", [dim, dim]),
              value("g", [dim]), value("b", [dim])]
    initializers, q, k, v, kt = [], "q", "k", "x", [0, 2, 1]
    if heads > 1:
        initializers = [helper.make_tensor("split", TensorProto.INT64, [4],
                                           [0, seq, heads, dim // heads]),
                        helper.make_tensor("merge", TensorProto.INT64, [3], [0, seq, dim])]
        for t in ("q", "k", "x"):
            nodes += [helper.make_node("Reshape", [t, "split"], [f"{t}4"], name=f"{t}_split"),
                      helper.make_node("Transpose", [f"{t}4"], [f"{t}h"], name=f"{t}_heads",
                                       perm=[0, 2, 1, 3])]
        q, k, v, kt = "qh", "kh", "xh", [0, 1, 3, 2]
    nodes += [
        helper.make_node("Transpose", [k], ["kt"], name="k_t", perm=kt),
        helper.make_node("MatMul", [q, "kt"], ["s"], name="scores"),
        helper.make_node("Softmax", ["s"], ["p"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["p", v], ["o"], name="mix"),
    ]
    if heads > 1:
        nodes += [helper.make_node("Transpose", ["o"], ["ot"], name="o_merge", perm=[0, 2, 1, 3]),
                  helper.make_node("Reshape", ["ot", "merge"], ["o3"], name="o_flat")]
    nodes.append(helper.make_node("LayerNormalization", ["o3" if heads > 1 else "o", "g", "b"],
                                  ["y"], name="norm", axis=-1))
    m = model(nodes, inputs, [value("y", None)], initializers)
    m.metadata_props.add(key="mdot.data_inputs", value="x")
    return m
