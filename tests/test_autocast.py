"""Autocast's tensors (`mdot_jax.gpu.autocast`): which outputs stay fp32, and the casts."""

from onnx import TensorProto, helper
from onnx_builders import model, value

from converters import convert
from mdot_jax.gpu import autocast
from mdot_jax.gpu import catalog as gpus
from mdot_jax.gpu.spec_sheet import classify


def _residual_block():
    """ids -> embedding e -> h = e W -> r = h + e -> n = LayerNorm(r) -> o = n W2 -> Relu:
    a transformer's residual stream in miniature."""
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
        helper.make_node("MatMul", ["e", "w"], ["h"], name="proj"),
        helper.make_node("Add", ["h", "e"], ["r"], name="residual"),
        helper.make_node("LayerNormalization", ["r", "g", "b"], ["n"], name="norm", axis=-1),
        helper.make_node("MatMul", ["n", "w2"], ["o"], name="out"),
        helper.make_node("Relu", ["o"], ["a"], name="act"),
    ]
    inputs = [value("ids", ["N", 8], TensorProto.INT64), value("table", [100, 16]),
              value("w", [16, 16]), value("g", [16]), value("b", [16]), value("w2", [16, 16])]
    m = model(nodes, inputs, [value("a", None)])
    m.metadata_props.add(key="mdot.data_inputs", value="ids")
    return m


def test_fp32_flows_from_weights_normalisations_and_promotion_and_stops_at_gemms():
    seq = convert(_residual_block(), batch_size=4, fuse=2)
    fp32 = dict(zip(seq.node_names.tolist(), autocast.fp32_outputs(seq)))
    assert fp32 == {"embed": True, "proj": False, "residual": True, "norm": True, "out": False,
                    "act": False}
    kinds = [classify(n, c, ld)[0] for n, c, ld in zip(seq.op_names, seq.config, seq.load)]
    h100 = gpus.find("h100-sxm")
    default = autocast.casts(seq, kinds, set(), h100, half_weights=False)
    each = autocast.casts(seq, kinds, set(), h100, half_weights=False,
                          fp32=autocast.fp32_outputs(seq))
    # the embedding's fp32 output is cast where the first GEMM reads it, forward and backward
    assert len(each) - len(default) == 2
    assert not autocast.casts(seq, kinds, set(range(seq.num_ops)), h100, False)  # all skipped
