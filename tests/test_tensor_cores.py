"""Tensor-core GEMMs at a measured share of the peak: the fit recovers known constants from a
table written in XLA's format, a step at AMP prices its GEMMs by them (never faster than the
roofline, warned as not measured on the GPU), fp32 and convolutions are untouched."""

import dataclasses
import json

import numpy as np
import pytest
from onnx_builders import attention

from converters import convert
from mdot_jax.gpu import catalog as gpus
from mdot_jax.gpu import peaks, spec_sheet, tensor_cores
from mdot_jax.gpu.work import roofline_ms, work

SHARE, MEMORY_SHARE, FIXED_MS = 0.7, 0.8, 0.006


def _table(folder):
    """matmul.csv in XLA's columns, each row's throughput that of the known constants."""
    rng = np.random.default_rng(0)
    h100 = gpus.find("h100-sxm")
    lines = ["gpu_key,b,m,n,k,dtype,flops_per_s"]
    for dtype, peak, width in (("bf16xbf16->bf16", "bf16", 2), ("f32xf32->f32", "tf32", 4)):
        seen = gpus.as_seen(h100, h100.tflops[peak], width)
        for _ in range(120):
            b, m, n, k = (int(2 ** rng.integers(0, 3)),) + tuple(
                int(256 * rng.integers(1, 17)) for _ in range(3))
            flops, moved, *_ = work("bmm", (b, m, n, k))
            ms = FIXED_MS + 1e3 * max(flops / (SHARE * seen.tflops["fp32"] * 1e12),
                                      moved / (MEMORY_SHARE * seen.memory_gbs * 1e9))
            lines.append(f"sm_90,{b},{m},{n},{k},{dtype},{flops / ms * 1e3:.6g}")
    (folder / "matmul.csv").write_text("\n".join(lines) + "\n")
    return folder


def test_the_fit_recovers_the_constants_of_each_arithmetic(tmp_path):
    fitted = tensor_cores.TensorCoreGemms.fit(_table(tmp_path))
    assert set(fitted.constants) == {"half", "tf32"}
    for c in fitted.constants.values():
        assert c.share_compute == pytest.approx(SHARE, rel=0.02)
        assert c.fixed_ms == pytest.approx(FIXED_MS, rel=0.05)
        assert c.rows == 120 and c.mape < 1.0
    back = tensor_cores.TensorCoreGemms.from_json(fitted.to_json())
    assert back == fitted


@pytest.fixture
def with_gemms(tmp_path):
    shipped = spec_sheet.load_step_model()
    gemms = tensor_cores.TensorCoreGemms.fit(_table(tmp_path))
    return shipped, dataclasses.replace(
        shipped, info=dict(shipped.info, tensor_core_gemms=gemms.to_json())), gemms


def _gemms(p):
    return sum(o["ms"] for o in p.operators if o["type"] in ("MatMul", "Gemm"))


def test_amp_gemms_are_priced_by_the_constants_fp32_is_not(with_gemms):
    shipped, model, gemms = with_gemms
    seq = convert(attention(seq=512, dim=1024), batch_size=8, fuse=True)
    a100 = gpus.find("a100-sxm-80gb")
    amp = spec_sheet.price(seq, a100, model, precision="amp-bf16", fit=False)
    assert any("of the nvidia-a100-sxm-80gb's bf16 peak" in w and "not measured on this GPU"
               in w for w in amp.warnings)
    assert amp.interval_ms is None  # AMP is still not banded
    before = spec_sheet.price(seq, a100, shipped, precision="amp-bf16", fit=False)
    assert _gemms(amp) != pytest.approx(_gemms(before), rel=1e-3)
    fp32 = [spec_sheet.price(seq, a100, m, precision="fp32", fit=False).iteration_ms
            for m in (shipped, model)]
    assert fp32[0] == pytest.approx(fp32[1], rel=1e-9)


def test_a_gemm_is_never_faster_than_its_roofline():
    gemms = tensor_cores.TensorCoreGemms(
        {"half": tensor_cores.Constants(1.0, 1.0, 0.0, 1, 0.0)}, "nvidia-h100-sxm", "test")
    a100 = gpus.find("a100-sxm-80gb")
    seen = gpus.as_seen(a100, a100.tflops["fp16"], 2)
    dims = [(1, 8192, 8192, 8192), (4, 64, 64, 64), (1, 16, 8192, 16)]
    ms = gemms.ms("fp16", ["bmm"] * 3, dims, [seen] * 3)
    assert all(t >= roofline_ms("bmm", d, seen) * (1 - 1e-9) for t, d in zip(ms, dims))


def test_the_shipped_step_model_holds_the_h100_tables_constants_alone():
    gemms = tensor_cores.TensorCoreGemms.from_json(
        spec_sheet.load_step_model().info["tensor_core_gemms"])
    assert gemms.gpu == "nvidia-h100-sxm" and "XLA" in gemms.source
    assert set(gemms.constants) == {"half", "tf32"}
    for c in gemms.constants.values():
        assert 0.3 < c.share_compute <= 1 and 0.3 < c.share_memory <= 1
        assert 0 < c.fixed_ms < 0.05 and c.rows == 375


def test_a_blackwell_gpu_is_priced_by_the_constants_of_its_architecture(tmp_path):
    """A table of the B200's GEMMs (XLA's key sm_100_B200) fits the B200's constants; the
    B200 and the GPUs of its architecture take them, other GPUs the step model's own."""
    (tmp_path / "matmul.csv").write_text(
        _table(tmp_path).joinpath("matmul.csv").read_text().replace("sm_90,", "sm_100_B200,"))
    b200 = tensor_cores.TensorCoreGemms.fit(tmp_path, source="a test")
    assert b200.gpu == "nvidia-b200-sxm" and b200.source == "a test"
    shipped = spec_sheet.load_step_model()
    info = dict(shipped.info, tensor_core_gemms_of={b200.gpu: b200.to_json()})
    for name, measured_on in (("b200", "nvidia-b200-sxm"), ("gb200", "nvidia-b200-sxm"),
                              ("b300", "nvidia-b200-sxm"), ("h100-sxm", "nvidia-h100-sxm"),
                              ("rtx5090", "nvidia-h100-sxm"), ("a100-sxm-80gb", "nvidia-h100-sxm")):
        gpu = gpus.find(name)
        _, gemms, note = peaks.tensor_core_gemms(info, gpu, "amp-bf16")
        assert gemms.gpu == measured_on, name
        assert (f"what the {measured_on}'s measured GEMMs reach" in note
                and ("measured on this GPU" in note) and (
                    "not measured" in note) == (gpu.name != measured_on)), note
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    rows = (tmp_path / "matmul.csv").read_text().splitlines()
    (mixed / "matmul.csv").write_text("\n".join([rows[0], rows[1], rows[2].replace(
        "sm_100_B200", "sm_90")]) + "\n")
    with pytest.raises(ValueError, match="several GPUs"):
        tensor_cores.TensorCoreGemms.fit(mixed)
    (mixed / "matmul.csv").write_text(rows[0] + "\n" + rows[1].replace("sm_100_B200", "sm_80")
                                      + "\n")
    with pytest.raises(ValueError, match=r"matmul.csv:2: gpu_key 'sm_80'"):
        tensor_cores.TensorCoreGemms.fit(mixed)


def test_the_blackwell_study_fits_a_b200_table_and_prices_steps_both_ways(tmp_path,
                                                                        monkeypatch):
    from benches import bench

    study = bench("bench_blackwell_gemms")
    h100, b200 = tmp_path / "h100", tmp_path / "b200"
    h100.mkdir()
    b200.mkdir()
    text = _table(h100).joinpath("matmul.csv").read_text()
    (b200 / "matmul.csv").write_text(text.replace("sm_90,", "sm_100_B200,"))
    monkeypatch.setattr(study, "STEPS", (("gpt2", dict(seq_len=128, batch_size=2)),))
    assert study.main(["--table", str(b200), "--h100", str(h100), "--out",
                       str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "results.json").read_text())
    assert set(report["constants"]) == {"nvidia-b200-sxm", "nvidia-h100-sxm",
                                        "nvidia-h100-sxm (the B200's shapes alone)"}
    for part in ("h100_constants_on_b200_rows", "b200_constants_on_b200_rows"):
        assert set(report[part]) == {"bf16", "tf32"}
    steps = report["steps_ms"]["gpt2"]  # the shipped model and it with the constants
    assert steps["shipped"] > 0 and steps["candidate"] > 0


def _sdpa_rows(share: float, kind: str = "sdpa-flash") -> list[dict]:
    """SDPA rows of the H200 sweep (`kind`) whose times are a known share of the bf16 peak."""
    h200 = gpus.find("h200")
    rows = []
    for s in (512, 1024, 2048, 4096):
        for d in (64, 128):
            flops = 7 * 4 * 16 * s * s * d  # forward and backward, causal (the sweep's count)
            rows.append(dict(kind=kind, precision="bf16", dims=[4, 16, s, d],
                             device="NVIDIA H200",
                             ms=0.2 + 1e3 * flops / (share * h200.tflops["bf16"] * 1e12)))
    return rows + [dict(kind="sdpa-efficient" if kind == "sdpa-flash" else "sdpa-flash",
                        precision="bf16", dims=[4, 16, 512, 64], device="NVIDIA H200",
                        ms=9.0)]  # another backend: not fitted


def test_fused_attention_is_priced_at_its_measured_share_on_its_architecture_alone():
    fitted = tensor_cores.fit_fused_attention(_sdpa_rows(0.25))
    assert fitted["share_compute"] == pytest.approx(0.25, rel=0.03)
    assert fitted["architecture"] == "hopper" and fitted["rows"] == 8
    with pytest.raises(ValueError, match="no measured SDPA flash kernels"):
        tensor_cores.fit_fused_attention(_sdpa_rows(0.25)[-1:])
    shipped = spec_sheet.load_step_model()
    plain = dataclasses.replace(shipped, info={k: v for k, v in shipped.info.items()
                                               if k != "fused_attention"})
    model = dataclasses.replace(shipped, info=dict(shipped.info, fused_attention=fitted))
    seq = convert(attention(seq=512, dim=1024), batch_size=8, fuse=True)
    share = tensor_cores.TensorCoreGemms.from_json(
        shipped.info["tensor_core_gemms"]).constants["half"].share_compute
    for device, slower in (("h100-sxm", share / 0.25), ("a100-sxm-80gb", 1.0)):
        gpu = gpus.find(device)
        a, b = (spec_sheet.price(seq, gpu, m, precision="amp-bf16", fit=False,
                                 attention="flash") for m in (plain, model))
        fused = [i for i, o in enumerate(a.operators) if o["type"] == spec_sheet.FUSED]
        assert fused, a.operators
        ratio = sum(b.operators[i]["ms"] for i in fused) / sum(a.operators[i]["ms"]
                                                                 for i in fused)
        if slower == 1.0:
            assert ratio == pytest.approx(1.0) and b.iteration_ms == a.iteration_ms
        else:  # the block's output MatMul holds the fused kernel: slower by the shares' ratio
            assert 1.5 < ratio <= slower * 1.03
            assert any("of the peak the nvidia-h200-sxm's measured SDPA flash" in w
                       and "not measured on this GPU" in w for w in b.warnings)


def test_a_block_given_a_mask_is_priced_at_the_memory_efficient_kernels_share():
    """A sweep with both backends fits both (`fit_attention`); a block with a sliding window its
    keys reach runs the memory-efficient kernel and is priced at its share, a block without at
    flash's; a model without the efficient kernel's fit prices both as flash."""
    from converters.attention import attention_blocks

    both = tensor_cores.fit_attention(_sdpa_rows(0.25)[:-1]
                                      + _sdpa_rows(0.1, "sdpa-efficient")[:-1])
    assert both["share_compute"] == pytest.approx(0.25, rel=0.03)
    assert both["efficient"]["share_compute"] == pytest.approx(0.1, rel=0.03)
    assert "efficient" not in tensor_cores.fit_attention(_sdpa_rows(0.25)[:-1])
    seq = convert(attention(seq=512, dim=1024), batch_size=8, fuse=True)
    shipped = spec_sheet.load_step_model()
    flash_only = {k: v for k, v in both.items() if k != "efficient"}

    def fused_ms(fitted: dict, window: int) -> tuple[float, list[str]]:
        model = dataclasses.replace(shipped, info=dict(shipped.info, fused_attention=fitted))
        p = spec_sheet.price(seq, gpus.find("h100-sxm"), model, precision="amp-bf16",
                             fit=False, attention="flash", blocks=[
                                 b._replace(window=window) for b in attention_blocks(seq)])
        return sum(o["ms"] for o in p.operators if o["type"] == spec_sheet.FUSED), p.warnings

    full = fused_ms(both, 0)[0]
    assert fused_ms(flash_only, 0)[0] == full and fused_ms(both, 513)[0] == full  # unreached
    assert fused_ms(flash_only, 256)[0] == pytest.approx(full, rel=0.05)  # every key, as flash
    windowed, said = fused_ms(both, 256)
    assert windowed / full == pytest.approx(2.5, rel=0.05)
    assert any("; 1 given a mask" in w and "at the 10% of the peak the "
               "nvidia-h200-sxm's measured SDPA memory-efficient" in w for w in said), said


def test_fp8_gemms_fit_the_sweeps_fp8_rows_at_the_fp8_peak():
    """Synthetic fp8 GEMMs at 60% of the H200's FP8 peak plus a 20 us call: the fit finds the
    share; other precisions' rows are not read; a sweep without fp8 rows, or of a GPU with no
    FP8 peak, is one error. The shipped model holds the H200 sweep's fit."""
    h200 = gpus.find("h200")
    rows = [dict(kind=kind, precision="fp8", dims=[b, m, m, m], device="NVIDIA H200",
                 ms=0.02 + 1e3 * 2 * b * m ** 3 / (0.6 * h200.tflops["fp8"] * 1e12))
            for kind, b in (("gemm", 1), ("bmm", 8)) for m in (1024, 2048, 4096, 8192)]
    rows.append(dict(rows[0], precision="bf16", ms=99.0))
    got = tensor_cores.fit_sweep_gemms(rows, "fp8")
    assert got["share_compute"] == pytest.approx(0.6, rel=0.02) and got["rows"] == 8
    assert got["gpu"] == "nvidia-h200-sxm"
    with pytest.raises(ValueError, match="no measured fp8 GEMMs"):
        tensor_cores.fit_sweep_gemms(rows[-1:], "fp8")
    with pytest.raises(ValueError, match="no fp8 peak"):
        tensor_cores.fit_sweep_gemms([dict(rows[0], device="NVIDIA A100-SXM4-80GB")], "fp8")
    shipped = spec_sheet.load_step_model().info["fp8_gemms"]
    assert shipped["gpu"] == "nvidia-h200-sxm" and shipped["rows"] == 120
    assert 0.3 < shipped["share_compute"] <= 1 and "kernels.jsonl" in shipped["source"]


def _heads(slow: float, device="NVIDIA H200"):
    """A sweep's language-model heads: each unaligned one `slow` times its twin's time per
    FLOP at bf16, as fast at fp32."""
    rows = []
    for t, vocab, d in ((64, 1001, 32), (64, 30522, 64)):
        for v in (vocab, -(-vocab // 64) * 64):
            for p, factor in (("bf16", slow), ("fp32", 1.0)):
                flops = 6.0 * t * v * d
                rows.append(dict(kind="linear-train", precision=p, dims=[t, v, d],
                                 device=device, flops=flops,
                                 ms=flops * 1e-9 * (factor if v % 64 else 1.0)))
    return rows


def test_unaligned_heads_fit_their_slowdown_per_arithmetic():
    fitted = tensor_cores.fit_unaligned(_heads(1.8))
    assert fitted["ratio"] == pytest.approx({"bf16": 1.8, "fp32": 1.0})
    assert fitted["pairs"] == {"bf16": 2, "fp32": 2} and fitted["architecture"] == "hopper"
    with pytest.raises(ValueError, match="no measured unaligned heads"):
        tensor_cores.fit_unaligned([r for r in _heads(1.8) if r["dims"][1] % 64])
    with pytest.raises(ValueError, match="several GPUs"):
        tensor_cores.fit_unaligned(_heads(1.8) + _heads(1.8, "NVIDIA A100-SXM4-80GB"))


def test_unaligned_batched_gemms_fit_their_slowdown_beside_twins_aligned_to_8():
    """The sweep's `bmm-unaligned` pairs (attention's products at 49 tokens beside 56), per
    arithmetic; the heads' rows are not theirs."""
    rows = []
    for dims in ((64, 49, 49, 32), (64, 56, 56, 32), (64, 49, 32, 49), (64, 56, 32, 56)):
        for p, factor in (("bf16", 2.5), ("fp32", 1.0)):
            flops = 2.0 * np.prod(dims)
            rows.append(dict(kind="bmm-unaligned", precision=p, dims=list(dims), flops=flops,
                             device="NVIDIA H100 80GB HBM3",
                             ms=flops * 1e-9 * (factor if dims[1] == 49 else 1.0)))
    fitted = tensor_cores.fit_unaligned(rows + _heads(1.8), "bmm-unaligned")
    assert fitted["ratio"] == pytest.approx({"bf16": 2.5, "fp32": 1.0})
    assert fitted["pairs"] == {"bf16": 2, "fp32": 2}
    with pytest.raises(ValueError, match="no measured unaligned batched GEMMs"):
        tensor_cores.fit_unaligned(_heads(1.8), "bmm-unaligned")


def test_a_linear_layer_of_unaligned_features_is_priced_at_the_measured_slowdown():
    from onnx import helper
    from onnx_builders import model as graph
    from onnx_builders import value

    def head(width):  # x [N, 256] -> a hidden layer -> a head of `width` outputs
        m = graph([helper.make_node("MatMul", ["x", "w1"], ["h"], name="hidden"),
                   helper.make_node("MatMul", ["h", "w2"], ["y"], name="head")],
                  [value("x", ["N", 256]), value("w1", [256, 256]), value("w2", [256, width])],
                  [value("y", None)])
        m.metadata_props.add(key="mdot.data_inputs", value="x")
        return m

    fitted = tensor_cores.fit_unaligned(_heads(2.0))
    shipped = spec_sheet.load_step_model()  # shared: copied, never changed
    assert shipped.info["unaligned_gemms"]["ratio"]["bf16"] > 1.1  # the H100's, measured
    unmeasured = dataclasses.replace(shipped, info={
        k: v for k, v in shipped.info.items() if k != "unaligned_gemms"})
    model = dataclasses.replace(shipped, info=dict(shipped.info, unaligned_gemms=fitted))
    for width, slower in ((1001, True), (1024, False)):
        seq = convert(head(width), batch_size=4096, fuse=True)
        for device, precision, expect in (("h200", "amp-bf16", slower),
                                          ("h200", "fp32", False),  # measured as fast
                                          ("a100-sxm-80gb", "amp-bf16", False)):  # not Hopper
            a, b = (spec_sheet.price(seq, gpus.find(device), m, precision=precision,
                                     fit=False) for m in (unmeasured, model))
            said = [w for w in b.warnings if "measured slowdown" in w]
            ms = [dict(zip(seq.node_names, p.node_ms(seq.num_ops))) for p in (a, b)]
            # its three GEMMs twice as long (its gradient's accumulation, a cast: as they were)
            assert ms[1]["head"] / ms[0]["head"] == (pytest.approx(1.95, abs=0.05) if expect
                                                     else 1.0)
            assert ms[1]["hidden"] == ms[0]["hidden"] and bool(said) == expect
            assert all(w.startswith("1 linear layer with features not a multiple of 16 bytes "
                                    "(1,001): at the") for w in said)  # its own, named
            # unpriced, on tensor cores: said as not measured (a model without the sweep's)
            unpriced = (slower and precision != "fp32", slower and precision != "fp32"
                        and not expect)
            assert [any("slower than priced here (not measured yet)" in w for w in p.warnings)
                    for p in (a, b)] == list(unpriced)
