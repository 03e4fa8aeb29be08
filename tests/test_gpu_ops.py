"""The GPU operator model: the work of an operator, the roofline, the split of NeuSight's
public measurements (the unseen GPUs never fitted), and a fit that carries to another GPU."""

import dataclasses
import json
import lzma
import math
from pathlib import Path

import numpy as np
import pytest

from mdot_jax.gpu import catalog as gpus
from mdot_jax.gpu import neusight
from mdot_jax.gpu.gpu_ops import (
    BinnedRoofline,
    GpuOpModel,
    StepPricer,
    backward_gemms,
    features,
)
from mdot_jax.gpu.work import roofline_ms, work

NEUSIGHT = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "neusight"
UNSEEN = {"nvidia-h100-sxm", "nvidia-l4", "nvidia-a100-pcie-80gb"}


def test_the_work_of_an_operator():
    flops, moved, tiles, used, k = work("bmm", (8, 256, 128, 64))
    assert flops == 2 * 8 * 256 * 128 * 64 and moved == 4 * 8 * (256 * 64 + 64 * 128 + 256 * 128)
    assert tiles == 8 * 2 * 1 and used == 1.0 and k == 64
    _, moved_linear, tiles_linear, _, _ = work("linear", (8, 256, 128, 64))
    assert moved_linear == 4 * (8 * 256 * 64 + 64 * 128 + 8 * 256 * 128)  # one weight
    assert tiles_linear == 16
    assert work("add", (4, 100))[1] == 4 * 400 * 3 and work("relu", (4, 100))[1] == 4 * 400 * 2
    with pytest.raises(ValueError, match="unknown operator 'erf'"):
        work("erf", (1, 2))


def test_a_convolution_is_an_implicit_gemm():
    # 3x3, stride 1, padding 1 on [2, 16, 8, 8] -> [2, 32, 8, 8]
    dims = neusight.conv_dims(2, 16, 32, 3, 8, 1, 1)
    assert dims == (1, 2 * 64, 32, 16 * 9, 2 * 16 * 64)
    flops, moved, tiles, _, k = work("conv", dims)
    assert flops == 2 * 2 * 64 * 32 * 16 * 9 and k == 16 * 9 and tiles == 1
    assert moved == 4 * (2 * 16 * 64 + 32 * 16 * 9 + 2 * 64 * 32)  # input, weight, output
    # depthwise: 16 groups of one channel each; stride 2 quarters the output pixels
    assert neusight.conv_dims(2, 16, 16, 3, 8, 2, 1, groups=16) == (16, 2 * 16, 1, 9, 2048)


def test_the_roofline_of_a_large_gemm_is_its_compute_time():
    h100 = gpus.find("h100-sxm")
    flops = 2 * 8192 ** 3
    assert math.isclose(roofline_ms("bmm", (1, 8192, 8192, 8192), h100),
                        1e3 * flops / (h100.tflops["fp32"] * 1e12))
    x = features(["bmm", "add"], [(1, 8192, 8192, 8192), (1024, 1024)], [h100, h100])
    assert x.shape == (2, 10) and np.isfinite(x).all()
    assert x[0, 4] > 0 > x[1, 4]  # compute-bound GEMM, memory-bound add (intensity / ridge)


needs_neusight = pytest.mark.skipif(not NEUSIGHT.is_dir(), reason="no ../shared/datasets")


@needs_neusight
def test_the_unseen_gpus_are_never_among_the_training_rows():
    rows = neusight.read(NEUSIGHT)
    assert set(neusight.training_gpus(rows)) == {
        "nvidia-p4", "nvidia-p100-pcie-16gb", "nvidia-t4", "nvidia-v100-pcie-32gb",
        "nvidia-a100-pcie-40gb"}
    assert UNSEEN <= {r.gpu for r in rows if r.split == "test"}
    assert not UNSEEN & {r.gpu for r in rows if r.split == "train"}
    assert {r.gpu for r in rows if r.op == "conv"} <= set(neusight.training_gpus(rows))


@needs_neusight
@pytest.mark.slow
def test_a_fit_on_two_gpus_prices_a_third_and_round_trips(tmp_path):
    rows = [r for r in neusight.read(NEUSIGHT) if r.split == "train"]
    rng = np.random.default_rng(0)

    def cols(rs):
        return ([r.op for r in rs], [r.dims for r in rs], [gpus.find(r.gpu) for r in rs],
                [r.ms for r in rs])

    fit = [rows[i] for i in rng.permutation(len(rows))[:6000]
           if rows[i].gpu in ("nvidia-t4", "nvidia-v100-pcie-32gb")]
    test = [r for r in rows if r.gpu == "nvidia-p100-pcie-16gb"][:500]
    model = GpuOpModel.fit(*cols(fit))
    o, d, g, ms = cols(test)
    pred = model.predict(o, d, g)
    assert np.isfinite(pred).all() and (pred > 0).all()
    assert np.median(np.abs(pred / np.asarray(ms) - 1)) < 0.5  # within 2x for most rows
    model.save(tmp_path / "m.json.xz")
    read = GpuOpModel.load(tmp_path / "m.json.xz")
    np.testing.assert_allclose(read.predict(o, d, g), pred)
    fast = lzma.compress(lzma.decompress((tmp_path / "m.json.xz").read_bytes()), preset=0)
    (tmp_path / "fast.json.xz").write_bytes(fast)  # what a model read from a file writes: the
    GpuOpModel.load(tmp_path / "fast.json.xz").save(tmp_path / "again.json.xz")  # bytes read
    assert (tmp_path / "again.json.xz").read_bytes() == fast  # (compressing takes seconds)
    dataclasses.replace(read, samples=1).save(tmp_path / "new.json.xz")  # another: its own
    assert GpuOpModel.load(tmp_path / "new.json.xz").samples == 1


def _node(name, kind, op, dims, params=0, fw=0.0, bw=0.0):
    return neusight.TraceNode(name, kind, op, dims, params, fw, bw, 0.0)


def _label(mode):
    """Embedding, then a layer of a linear, a dropout and a softmax run 3 times, then a view."""
    nodes = (_node("emb", "embedding", "addu", (8, 64), params=1000),
             _node("fc", "linear", "linear", (1, 8, 32, 64), params=64 * 32 + 32),
             _node("drop", "dropout", "mul", (8, 32)),
             _node("sm", "softmax", "softmax", (8, 32)),
             _node("view", "free", "", ()))
    return neusight.Label("nvidia-h100-sxm", "m", mode, 8, 1, 3, 1.0, 1.0, 0.0, nodes, (1, 4))


def test_a_step_is_priced_node_by_node_and_composed_layer_by_layer():
    """With a pricer of 1 ms per FLOP-free op and FLOPs/1e3 ms per GEMM: inference prices no
    dropout, no backward; training adds a GEMM's two backward GEMMs (each its forward's
    FLOPs), the other nodes' measured ratios, and the accumulation of each weight."""
    def pricer(ops, dims, gs):
        return np.asarray([work(o, d)[0] / 1e3 if o in neusight.GEMMS else 1.0
                           for o, d in zip(ops, dims)])

    h100 = gpus.find("h100-sxm")
    step = StepPricer(pricer, {"softmax": 2.0, "dropout": 3.0, "embedding": 4.0})
    gemm = 2 * 8 * 32 * 64 / 1e3
    inf = step.predict(_label("inf"), h100)
    assert inf == dict(fw=1 + 3 * (gemm + 1), bwall=0.0, e2e=1 + 3 * (gemm + 1))
    for op, dims in backward_gemms("linear", (1, 8, 32, 64)):
        assert work(op, dims)[0] == work("linear", (1, 8, 32, 64))[0]
    train = step.predict(_label("train"), h100)
    assert train["fw"] == pytest.approx(1 + 3 * (gemm + 1 + 1))
    backward = 4 + 3 * (2 * gemm + 3 + 2)  # embedding; the layer's GEMMs, dropout, softmax
    accumulation = 1 + 3 * 1  # the embedding's and the linear's weights
    assert train["bwall"] == pytest.approx(backward + accumulation)


def test_the_binned_roofline_is_held_flat_beyond_what_it_fitted():
    h100, t4 = gpus.find("h100-sxm"), gpus.find("t4")
    dims = [(1, n, n, n) for n in (64, 128, 256, 512, 1024, 2048)]
    ms = [3 * roofline_ms("bmm", d, t4) for d in dims]  # T4 runs them at a third of peak
    model = BinnedRoofline.fit(["bmm"] * 6, dims, [t4] * 6, ms, bins=3)
    np.testing.assert_allclose(model.predict(["bmm"] * 6, dims, [t4] * 6), ms)
    huge = (1, 8192, 8192, 8192)
    assert model.predict(["bmm"], [huge], [h100])[0] == pytest.approx(
        3 * roofline_ms("bmm", huge, h100))


@needs_neusight
def test_every_traced_label_is_read_and_its_compute_is_priced():
    """Every single-GPU NVIDIA label with a trace; the unseen GPUs' labels are there to be
    predicted and are not the training GPUs'; the nodes left unpriced (views, metadata) hold
    a small part of the measured forward time of every model."""
    labels = neusight.labels(NEUSIGHT)
    assert UNSEEN <= {x.gpu for x in labels}
    assert {(x.gpu, x.mode) for x in labels if x.gpu in UNSEEN} >= {
        (g, "train") for g in UNSEEN}
    for x in labels:
        a, b = x.layer
        assert 0 < a < b <= len(x.nodes) and x.e2e_ms > 0, (x.gpu, x.model)
        free = x.compose([n.fw_ms if n.kind == "free" else 0 for n in x.nodes])
        assert free < 0.25 * x.compose([n.fw_ms for n in x.nodes]), (x.gpu, x.model, x.batch)
        assert any(n.kind == "linear" for n in x.nodes[a:b])


def test_the_committed_whole_model_evaluation_fitted_no_unseen_gpu():
    """`benchmarks/results/gpu-neusight`: fitted on the five training GPUs, every row a label
    of the three unseen ones, with our prediction alone (NeuSight's measured times and its own
    predictions stay in its folder: the MAPEs beside them are computed from them there)."""
    import json

    r = json.loads((Path(__file__).resolve().parents[1] / "benchmarks" / "results" /
                    "gpu-neusight" / "results.json").read_text())
    assert len(r["fitted_gpus"]) == 5 and not UNSEEN & set(r["fitted_gpus"])
    assert {x["gpu"] for x in r["rows"]} == UNSEEN and len(r["rows"]) >= 30
    assert all(x["predicted_ms"] > 0 for x in r["rows"])
    assert r["mape"]["(all) train"]["neusight"] > 0


@pytest.mark.slow
@needs_neusight
def test_the_committed_neusight_protocol_is_the_shipped_pricings(tmp_path):
    """The README's NeuSight protocol numbers come from `gpu-neusight/onnx.json`: a change of
    the pricing that moves its predictions re-runs `bench_gpu_ops.py --onnx` (three labels, one
    of each unseen GPU, priced again from their configs)."""
    from benches import bench

    from mdot_jax.gpu.spec_sheet import load_step_model

    committed = json.loads((Path(__file__).resolve().parents[1] / "benchmarks" / "results" /
                            "gpu-neusight" / "onnx.json").read_text())
    kept = {(r["gpu"], r["model"], r["batch"], r["seq_len"]): r["predicted_ms"]
            for r in committed["rows"]}
    labels = {lab["gpu"]: lab for lab in sorted(
        neusight.train_labels(NEUSIGHT), key=lambda x: (x["seq_len"] * x["batch"], x["model"]))
        if lab["gpu"] in UNSEEN and lab["model"] != "switchxl4"}  # the smallest of each GPU
    onnx_price, model = bench("bench_gpu_ops").onnx_price, load_step_model()
    for gpu, lab in sorted(labels.items()):
        key = (gpu, lab["model"], lab["batch"], lab["seq_len"])
        assert onnx_price(lab, NEUSIGHT, tmp_path, model) == pytest.approx(kept[key],
                                                                          rel=1e-4), key


def test_no_committed_result_copies_a_public_tables_numbers():
    """NeuSight's measured times and predictions, and timm's inference tables, are read in
    `../shared/datasets/` and never written into the repository (their READMEs)."""
    import json

    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    for f in [*results.rglob("*.json"), *results.rglob("*.jsonl")]:
        text = f.read_text()
        assert "neusight_ms" not in text and "roofline_ms" not in text, f
    for f in [*results.glob("**/ns-*/onnx.json"), *results.glob("gpu-neusight/*.json")]:
        if f.name != "rtx3090.json":  # timm's training rows, which the repository holds
            assert all("measured_ms" not in r for r in json.loads(f.read_text())["rows"]), f
    for f in results.glob("timm-inference-*/rows.jsonl"):
        assert all("measured_ms" not in json.loads(line) for line in f.read_text().split(
            "\n") if line), f


def test_the_committed_evaluations_fitted_nothing_of_the_gpus_they_score():
    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "gpu-neusight"
    steps, onnx_path, timm = (json.loads((results / f).read_text())
                              for f in ("results.json", "onnx.json", "rtx3090.json"))
    for r in (steps, onnx_path, timm):
        assert not (UNSEEN | {"nvidia-rtx-3090"}) & set(r["fitted_gpus"])
    assert UNSEEN == {r["gpu"] for r in steps["rows"]}
    assert UNSEEN <= {r["gpu"] for r in onnx_path["rows"] if not r["fitted"]}
    assert all(r["fitted"] == (r["gpu"] in onnx_path["fitted_gpus"]) for r in onnx_path["rows"])
    assert timm["gpu"] == "nvidia-rtx-3090" and len(timm["rows"]) == 39


def test_a_deep_models_repeated_kernels_are_priced_once_each(monkeypatch):
    """80 identical layers repeat their kernels: each distinct (op, dims, GPU) is priced once
    and the times land where each kernel runs."""
    from mdot_jax.gpu import catalog
    from mdot_jax.gpu.gpu_ops import GpuOpModel
    from mdot_jax.gpu.spec_sheet import load_step_model

    model, h100 = load_step_model(), catalog.find("h100-sxm")
    rows = [("linear", (1, 512, 768, 768)), ("add", (1, 1 << 20)), ("linear", (1, 512, 768, 768)),
            ("softmax", (4096, 512)), ("add", (1, 1 << 20))]
    alone = [float(model.kernel_ms([o], [d], [h100], True)[0]) for o, d in rows]
    seen, real = [], GpuOpModel.predict
    monkeypatch.setattr(GpuOpModel, "predict",
                        lambda self, ops, *a: seen.append(len(ops)) or real(self, ops, *a))
    got = model.kernel_ms([o for o, _ in rows], [d for _, d in rows], [h100] * 5, True)
    np.testing.assert_allclose(got, alone)
    assert seen == [3] + [1] * model.info["split_gemms"]  # 3 of 5; the GEMM's pieces once


def test_rows_priced_before_are_not_asked_of_the_trees_again(monkeypatch):
    """Another layout, precision or GPU asks again for rows priced before: the same answers,
    the trees asked only for the new ones, and the store emptied when full."""
    import mdot_jax.gpu.gpu_ops as gpu_ops
    from mdot_jax.gpu.spec_sheet import load_step_model

    text = load_step_model().ops.text
    ops, dims = ["linear", "add", "softmax"], [(1, 512, 768, 768), (1, 1 << 20), (4096, 512)]
    h100, a100 = gpus.find("h100-sxm"), gpus.find("a100-sxm4-80gb")
    fresh = [GpuOpModel(text, (), 0).predict(ops, dims, [g] * 3) for g in (h100, a100)]
    model, asked = GpuOpModel(text, (), 0), []
    model.predict(ops[:1], dims[:1], [h100])
    real = model._boosters[0].predict
    model._boosters[0].predict = lambda x: asked.append(len(x)) or real(x)
    np.testing.assert_array_equal(model.predict(ops, dims, [h100] * 3), fresh[0])
    np.testing.assert_array_equal(model.predict(ops, dims, [a100] * 3), fresh[1])
    assert asked == [2, 3]
    monkeypatch.setattr(gpu_ops, "KNOWN_ROWS", 4)
    l4 = gpus.find("l4")
    model.predict(ops, dims, [l4] * 3)  # 6 + 3 > 4: emptied, then these three
    assert asked == [2, 3, 3] and len(model._known) == 3
    # three known and two new rows overflow it: emptied, and all five asked again
    both = model.predict(ops + ops[:2], dims + dims[:2], [l4] * 3 + [h100] * 2)
    np.testing.assert_array_equal(both, np.concatenate([
        GpuOpModel(text, (), 0).predict(ops, dims, [l4] * 3), fresh[0][:2]]))
    assert asked == [2, 3, 3, 5] and len(model._known) == 5


def test_a_gemm_is_never_priced_above_its_halves():
    """`split_gemms`: a price that balloons past an output side of 4,096 (as trees flat
    outside what they saw can) is capped by the pieces' price; the larger side is halved;
    other kernels and GEMMs already cheaper than their pieces keep their own price."""
    from mdot_jax.gpu.gpu_ops import split_gemms

    asked = []

    def price(ops, dims, seen):  # 1 ms a GFLOP, 10x past 4,096 on an output side
        asked.append(list(dims))
        return np.asarray([2e-9 * np.prod(d) * (10 if o != "add" and max(d[1], d[2]) > 4096
                                               else 1) for o, d in zip(ops, dims)])

    dims = [(1, 4096, 30522, 1024), (1, 1024, 1024, 1024), (1, 1 << 20)]
    got = split_gemms(price, ["linear", "linear", "add"], dims, [None] * 3, 4)
    assert got[0] == pytest.approx(2e-9 * 4096 * 8 * 3816 * 1024)  # 8 pieces of 3,816: 1x
    assert got[1] == pytest.approx(2e-9 * 1024 ** 3) and got[2] == pytest.approx(2e-9 * 2 ** 20)
    assert asked[1][0] == (1, 4096, 15261, 1024) and asked[1][1] == (1, 512, 1024, 1024)
    assert (split_gemms(price, ["linear"], dims[:1], [None], 0) == price(["linear"], dims[:1],
                                                                        [None])).all()


def test_a_traced_kernel_is_classed_by_its_name():
    """A traced step's kernels are summed by class (`measure.profiler.kernel_class`, what
    `bench_gpu_ops --measured` reads): cuBLAS and CUTLASS GEMMs, cuDNN's convolutions but not
    its batch norm, PyTorch's depthwise kernels, FlashAttention, the foreach optimizer, layout
    transposes, torch.compile's generated kernels; what it cannot tell, other."""
    from mdot_jax.measure.profiler import kernel_class

    cases = {
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_cublas": "gemm",
        "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn": "gemm",
        "nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NTN": "gemm",  # cuBLAS 12's Hopper kernels
        "sm80_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nchw": "conv",
        "void cudnn::bn_fw_tr_1C11_kernel_NCHW<__nv_bfloat16, float, 512, true, 1>": "batch norm",
        "void at::native::conv_depthwise2d_grad_weight_kernel<float, float>": "depthwise conv",
        "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel": "attention",
        "void at::native::multi_tensor_apply_kernel<TensorListMetadata<3>>": "optimizer",
        "void nchwToNhwcKernel<__nv_bfloat16, __nv_bfloat16, float, true>": "layout",
        "void at::native::vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>": "elementwise",
        "triton_per_fused_add_native_layer_norm_7": "generated",  # torch.compile's, not a norm
        "some_new_kernel": "other",
    }
    assert {name: kernel_class(name) for name in cases} == cases
