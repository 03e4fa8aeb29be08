"""Convolutions and batch norms at the shares a lent GPU's sweep measured (`gpu.cnn_kernels`,
pre-registered): the fit recovers the constants a sweep was made with, and a step model holding
them prices a CNN's convolutions and batch norms, on GPUs of the sweep's architecture only."""

import dataclasses

import pytest
from onnx import helper
from onnx_builders import model as graph
from onnx_builders import value

from converters import convert
from mdot_jax.gpu import catalog as gpus
from mdot_jax.gpu import cnn_kernels, spec_sheet
from mdot_jax.gpu.tensor_cores import Constants
from mdot_jax.measure import kernel_sweep

TRUTH = {"dense": Constants(0.5, 0.6, 0.01, 0, 0), "depthwise": Constants(0.3, 0.25, 0.02, 0, 0),
         "bn-forward": Constants(1.0, 0.5, 0.005, 0, 0),
         "bn-backward": Constants(1.0, 0.4, 0.008, 0, 0)}


def _sweep(device="NVIDIA H200", kinds=("conv-train", "dwconv-train", "batch_norm")):
    """The kit's NCHW CNN rows, timed as `TRUTH` prices them on `device`."""
    gpu, rows = gpus.find(device), []
    for r in kernel_sweep.plan(False):
        if r.get("layout") != "nchw" or not r["kind"].startswith(kinds):
            continue
        if r["kind"].endswith("conv-train"):
            name, kernels = cnn_kernels.swept_conv(r)
            at = cnn_kernels.seen(gpu, r["precision"], True)
            ms = sum(TRUTH[name].ms(o, d, at) for o, d in kernels)
        else:
            n, c, h = r["dims"]
            at = cnn_kernels.seen(gpu, r["precision"], False)
            ms = sum(TRUTH[f"bn-{phase}"].ms("ln", (n * c, h * h), at) for phase in (
                ("forward",) if r["kind"] == "batch_norm" else ("forward", "backward")))
        rows.append(dict(r, device=device, ms=ms))
    return rows


def test_the_fit_recovers_what_the_sweep_measured():
    fitted = cnn_kernels.fit(_sweep())
    assert fitted["architecture"] == "hopper" and fitted["gpu"] == "nvidia-h200-sxm"
    assert set(fitted["constants"]) == {f"{k}/{p}" for k in TRUTH for p in ("fp32", "bf16")}
    for key, c in fitted["constants"].items():
        truth = TRUTH[key.split("/")[0]]
        assert c["share_memory"] == pytest.approx(truth.share_memory, rel=0.02)
        assert c["fixed_ms"] == pytest.approx(truth.fixed_ms, rel=0.05) and c["mape"] < 1
        if key.startswith("dense"):  # compute-bound: its share of the peak is seen
            assert c["share_compute"] == pytest.approx(truth.share_compute, rel=0.02)
    with pytest.raises(ValueError, match="no measured NCHW convolutions"):
        cnn_kernels.fit([r for r in _sweep() if r["kind"] == "conv-train"
                         and r["precision"] == "fp8"])
    with pytest.raises(ValueError, match="several GPUs"):
        cnn_kernels.fit(_sweep() + _sweep("NVIDIA A100-SXM4-80GB"))


def _mobile_block():
    """x [N, 32, 28, 28] -> a dense 3x3 convolution -> batch norm -> a depthwise 3x3 one."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="dense", kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"],
                              name="bn"),
             helper.make_node("Conv", ["n", "dw"], ["y"], name="depthwise", group=64,
                              kernel_shape=[3, 3], pads=[1, 1, 1, 1])]
    m = graph(nodes, [value("x", ["N", 32, 28, 28]), value("w", [64, 32, 3, 3]),
                      value("dw", [64, 1, 3, 3])] + [value(k, [64]) for k in "sbmv"],
              [value("y", None)])
    m.metadata_props.add(key="mdot.data_inputs", value="x")
    return m


def test_a_step_model_holding_them_prices_convolutions_and_batch_norms_on_their_architecture():
    seq = convert(_mobile_block(), batch_size=64, fuse=True)
    shipped = spec_sheet.load_step_model()  # shared: copied, never changed
    dense_only = cnn_kernels.fit(_sweep(kinds=("conv-train",)))
    for fitted, measured in ((cnn_kernels.fit(_sweep()), {"dense", "bn", "depthwise"}),
                             (dense_only, {"dense"})):
        model = dataclasses.replace(shipped, info=dict(shipped.info, cnn_kernels=fitted))
        for device, precision, hopper in (("h100 sxm", "amp-bf16", True),
                                          ("h100 sxm", "fp32", True),
                                          ("a100-sxm-80gb", "amp-bf16", False)):
            a, b = (spec_sheet.price(seq, gpus.find(device), m, precision=precision, fit=False)
                    for m in (shipped, model))
            ms = [dict(zip(seq.node_names, p.node_ms(seq.num_ops))) for p in (a, b)]
            changed = {n for n in ("dense", "bn", "depthwise") if ms[1][n] != ms[0][n]}
            assert changed == (measured if hopper else set())
            said = any("measured bf16 NCHW" in w or "measured fp32 NCHW" in w
                       for w in b.warnings)
            assert said == hopper
            unmeasured = any("convolutions are not 3x3" in w for w in b.warnings)
            assert unmeasured == (not hopper or "depthwise" not in measured)
    at = cnn_kernels.seen(gpus.find("h100 sxm"), "bf16", True)
    kernels = cnn_kernels.conv_kernels((1, 64 * 28 * 28, 64, 32 * 9, 64 * 32 * 28 * 28), 1, 32,
                                       9, 64 * 64 * 28 * 28, False)
    assert [o for o, _ in kernels] == ["conv", "bmm"]  # the graph's input: no data gradient
    model = dataclasses.replace(shipped, info=dict(shipped.info, cnn_kernels=dense_only))
    p = spec_sheet.price(seq, gpus.find("h100 sxm"), model, precision="amp-bf16", fit=False)
    dense = dict(zip(seq.node_names, p.node_ms(seq.num_ops)))["dense"]
    c = Constants(**dense_only["constants"]["dense/bf16"])
    assert dense >= sum(c.ms(o, d, at) for o, d in kernels) > 0  # and its weight's add, cast
