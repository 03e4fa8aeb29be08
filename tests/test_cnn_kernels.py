"""Convolutions and batch norms at the shares a lent GPU's sweep measured (`gpu.cnn_kernels`,
pre-registered): the fit recovers the constants a sweep was made with, and a step model holding
them prices a CNN's convolutions and batch norms, on GPUs of the sweep's architecture only.
Channels-last (adopted): the layout ratios are the sweep's, and scale those kernels alone."""

import dataclasses

import numpy as np
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
            unmeasured = any("not 3x3 stride-1 dense" in w for w in b.warnings)
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


RATIOS = {"dense": (0.5, 0.8), "depthwise": (0.25, 0.3), "batch norm": (0.6, 0.45)}


def _both_layouts(device="NVIDIA H100 80GB HBM3"):
    """The kit's CNN rows in both layouts: NCHW at 1 ms forward, 3 ms with the backward; NHWC
    at `RATIOS` of those."""
    rows = []
    for r in kernel_sweep.plan(False):
        kind = next((k for k, pair in cnn_kernels.LAYOUT_KINDS.items() if r["kind"] in pair),
                    None)
        if kind and r.get("layout") in ("nchw", "nhwc") and r["precision"] in ("fp32", "bf16"):
            fw, bw = RATIOS[kind] if r["layout"] == "nhwc" else (1.0, 1.0)
            rows.append(dict(r, device=device, ms=fw + (2 * bw if r["kind"].endswith(
                "-train") else 0.0)))
    return rows


def test_the_layout_ratios_are_what_the_sweep_measured_in_each_layout():
    fitted = cnn_kernels.fit_layout(_both_layouts())
    assert fitted["gpu"] == "nvidia-h100-sxm"
    assert set(fitted["ratios"]) == {f"{k}/{p}" for k in RATIOS for p in ("fp32", "bf16")}
    for key, r in fitted["ratios"].items():
        assert (r["forward"], r["backward"]) == pytest.approx(RATIOS[key.split("/")[0]])
    with pytest.raises(ValueError, match="fewer than 4 shapes"):  # one layout alone
        cnn_kernels.fit_layout([r for r in _both_layouts() if r["layout"] == "nchw"])
    with pytest.raises(ValueError, match="several GPUs"):
        cnn_kernels.fit_layout(_both_layouts() + _both_layouts("NVIDIA H200"))


def test_a_channels_last_step_scales_each_convolution_and_batch_norm_by_its_ratios():
    seq = convert(_mobile_block(), batch_size=64, fuse=True)
    shipped = spec_sheet.load_step_model()
    model = dataclasses.replace(shipped, info=dict(
        shipped.info, channels_last=cnn_kernels.fit_layout(_both_layouts())))
    gpu = gpus.find("a100-sxm-80gb")  # not the sweep's GPU: the ratios apply on every one
    times = {}
    for m, layout in ((shipped, "nchw"), (model, "nchw"), (model, "nhwc")):
        times[m is model, layout] = ks = []
        p = spec_sheet.price(seq, gpu, m, precision="amp-bf16", fit=False, kernels=ks,
                             layout=layout)
        assert any("channels-last" in w for w in p.warnings) == (layout == "nhwc")
    assert times[True, "nchw"] == times[False, "nchw"]  # an NCHW step is not changed
    ratios = np.round(np.asarray(times[True, "nhwc"]) / times[False, "nchw"], 6)
    # dense: its forward and its weights' gradient (its input is the graph's: no data
    # gradient); batch norm: forward and backward; depthwise: forward and both gradients
    expected = {0.5: 1, 0.8: 1, 0.6: 1, 0.45: 1, 0.25: 1, 0.3: 2}
    assert {r: int((ratios == r).sum()) for r in expected} == expected
    assert set(ratios) - set(expected) == {1.0}
    said = [w for d, p in (("a100-sxm-80gb", "amp-bf16"), ("p100", "amp-fp16"), ("t4", "fp32"))
            for w in spec_sheet.price(seq, gpus.find(d), model, precision=p, fit=False,
                                      layout="nhwc").warnings if "channels-last" in w]
    assert ["without the tensor cores" in w for w in said] == [False, True, True]
    with pytest.raises(ValueError, match="prices nchw only"):
        spec_sheet.price(seq, gpu, dataclasses.replace(shipped, info={
            k: v for k, v in shipped.info.items() if k != "channels_last"}), layout="nhwc")
    with pytest.raises(ValueError, match="layout 'chw'"):
        spec_sheet.price(seq, gpu, model, layout="chw")


def test_the_shipped_ratios_were_measured_on_another_gpu_than_the_steps_that_chose_them():
    # docs/studies/channels-last.md: decided on timm's RTX 3090 channels-last steps
    fitted = spec_sheet.load_step_model().info["channels_last"]
    assert fitted["gpu"] != gpus.find("rtx 3090").name
    devices = {r["device"] for r in kernel_sweep.read(fitted["source"]) if "layout" in r}
    assert devices and all(gpus.find(d).name == fitted["gpu"] for d in devices)
