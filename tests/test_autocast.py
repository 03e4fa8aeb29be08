"""Autocast's casts (`gpu.autocast`): each tensor's type followed through a step, and the cast
kernels PyTorch runs where a type changes."""

import numpy as np
import pytest
from onnx import helper
from onnx_builders import conv_bn_relu, model, value

from converters import convert
from mdot_jax.autograd import backward
from mdot_jax.gpu import autocast
from mdot_jax.gpu import catalog as gpus
from mdot_jax.gpu.classify import classified

H, F = autocast.HALF_OUT, autocast.FP32_OUT


def _block():
    """x -> Relu (fp32: it reads no node) -> a; q = a Wq; p = softmax(q); o = p Wv; r = o + a;
    LayerNorm(r): a GEMM reading fp32, softmax reading half, a half branch added to fp32."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("MatMul", ["a", "wq"], ["q"], name="q"),
             helper.make_node("Softmax", ["q"], ["p"], name="softmax", axis=-1),
             helper.make_node("MatMul", ["p", "wv"], ["o"], name="mix"),
             helper.make_node("Add", ["o", "a"], ["r"], name="residual"),
             helper.make_node("LayerNormalization", ["r", "g", "b"], ["y"], name="ln", axis=-1)]
    m = model(nodes, [value("x", ["N", 4, 16]), value("wq", [16, 16]), value("wv", [16, 16]),
                      value("g", [16]), value("b", [16])], [value("y", None)])
    m.metadata_props.add(key="mdot.data_inputs", value="x")
    return convert(m, batch_size=2, fuse=True)


def _casts(seq, precision="amp-bf16", half_weights=False, activations=True):
    kinds = [k for k, _, _ in classified(seq)]
    return autocast.casts(seq, kinds, set(), gpus.find("h100-sxm"), half_weights,
                          backward(seq), precision, activations)


def test_types_follow_autocast_and_promotion():
    seq = _block()
    kinds = [k for k, _, _ in classified(seq)]
    of = dict(zip(seq.op_names.tolist(), autocast.types(seq, kinds)))
    # GEMMs half; softmax and layer norm fp32; the half branch added to fp32 promoted
    assert of == dict(Relu=F, MatMul=H, Softmax=F, Add=F, LayerNormalization=F)
    cnn = convert(conv_bn_relu(training=True), batch_size=2, fuse=True)
    kinds = [k for k, _, _ in classified(cnn)]
    # batch norm keeps the convolution's half type, and so does what follows it
    assert set(autocast.types(cnn, kinds).tolist()) == {H}
    assert _casts(cnn, activations=True) == _casts(cnn, activations=False)  # weights' alone


def test_the_casts_pytorch_runs_in_a_block():
    seq = _block()
    phases = [w[1] for w in _casts(seq)]
    # two weights cast and their gradients back (4); the fp32 Relu output the first GEMM reads
    # and the fp32 softmax output the second reads, each cast and its gradient back (4); the
    # half scores softmax reads cast up and back (2); the residual's half branch's gradient (1)
    assert len(phases) == 11 and phases.count("bw") == 6
    assert len(_casts(seq, "amp-fp16")) == 9  # fp16 softmax reads its half input in place
    assert len(_casts(seq, half_weights=True)) == 7  # FSDP's weights arrive in the half type
    assert len(_casts(seq, activations=False)) == 4  # a compiled step: the weights' alone
    sizes = sorted(w[3][1] for w in _casts(seq))
    assert sizes.count(16 * 16) == 4 and set(sizes) == {16 * 16, 2 * 4 * 16}


@pytest.mark.parametrize("bias", [True, False])
def test_a_bias_is_cast_apart_from_its_weight(bias):
    nodes = [helper.make_node("Gemm", ["x", "w"] + (["c"] if bias else []), ["y"], name="fc",
                              transB=1)]
    m = model(nodes, [value("x", ["N", 16]), value("w", [32, 16])]
              + ([value("c", [32])] if bias else []), [value("y", None)])
    m.metadata_props.add(key="mdot.data_inputs", value="x")
    seq = convert(m, batch_size=4, fuse=True)
    sizes = [w[3][1] for w in _casts(seq) if w[1] == "fw"]
    assert sizes == ([32 * 16, 32] if bias else [32 * 16])
    assert np.sum(sizes) == seq.params


def test_a_price_shows_the_casts_apart_from_the_nodes_they_surround():
    from mdot_jax.gpu import spec_sheet

    seq, model = _block(), spec_sheet.load_step_model()
    gpu = gpus.find("h100-sxm")
    amp, fp32 = (spec_sheet.price(seq, gpu, model, precision=p, fit=False)
                 for p in ("amp-bf16", "fp32"))
    casts = [o for o in amp.operators if o["type"] == spec_sheet.CASTS]
    # each beside its node (its index and name): both GEMMs', softmax's, the residual's
    assert {o["name"] for o in casts} == {"q", "mix", "softmax", "residual"}
    for o in casts:
        assert seq.node_names[o["index"]] == o["name"] and o["ms"] > 0
    assert not [o for o in fp32.operators if o["type"] == spec_sheet.CASTS]
    assert amp.node_ms(seq.num_ops).sum() == pytest.approx(  # the step's time unchanged
        amp.phases["forward"] + amp.phases["backward"])
