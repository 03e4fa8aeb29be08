"""Memory-bound kernels at a measured share of the bandwidth: the fit recovers known constants
from sweep rows, a step prices its memory-bound kernels by them (GEMMs untouched), and behind a
host each kernel's GPU part drops the fixed cost."""

import dataclasses

import numpy as np
import pytest
from onnx_builders import attention

from converters import convert
from mdot_jax.gpu import catalog as gpus
from mdot_jax.gpu import spec_sheet, streaming
from mdot_jax.gpu.work import work

SHARE, FIXED_MS = 0.8, 0.015


def _rows(n: int = 60) -> list[dict]:
    """Sweep rows of the H200 whose times are those of the known constants."""
    rng = np.random.default_rng(0)
    h200 = gpus.find("h200")
    out = []
    for kind, op in streaming.SWEEP_OPS.items():
        for precision, width in (("fp32", 4), ("bf16", 2)):
            seen = gpus.as_seen(h200, h200.tflops["fp32"], width)
            for _ in range(n // 10):
                dims = [int(2 ** rng.integers(4, 16)), int(64 * rng.integers(1, 64))]
                moved = work(op, dims)[1]
                ms = FIXED_MS + 1e3 * moved / (SHARE * seen.memory_gbs * 1e9)
                out.append(dict(kind=kind, precision=precision, dims=dims, ms=ms,
                                device="NVIDIA H200"))
    out.append(dict(kind="gemm", precision="bf16", dims=[1, 64, 64, 64], ms=1.0,
                    device="NVIDIA H200"))  # not memory-bound: not fitted
    return out


def test_the_fit_recovers_the_constants_of_each_class():
    fitted = streaming.fit(_rows())
    assert set(fitted) == {"elementwise", "rowwise"}
    for c in fitted.values():
        assert c["share_memory"] == pytest.approx(SHARE, rel=0.02)
        assert c["fixed_ms"] == pytest.approx(FIXED_MS, rel=0.05) and c["mape"] < 1
    with pytest.raises(ValueError, match="no measured memory-bound kernels"):
        streaming.fit([r for r in _rows() if r["kind"] == "gemm"])


def test_a_step_prices_memory_bound_kernels_by_them_and_gemms_as_before():
    shipped = spec_sheet.load_step_model()  # shared: copied, never changed
    base = dataclasses.replace(shipped, info={
        k: v for k, v in shipped.info.items() if k != "streaming_kernels"})
    constants = streaming.fit(_rows())
    model = dataclasses.replace(base, info=dict(
        base.info, streaming_kernels=dict(constants=constants, gpu="nvidia-h200-sxm")))
    seq = convert(attention(seq=64, dim=256), batch_size=8, fuse=True)
    h100 = gpus.find("h100-sxm")
    before, after = (spec_sheet.price(seq, h100, m, precision="fp32", fit=False, host_ms=0.0)
                     for m in (base, model))  # kernels alone, each with its fixed cost
    by = {p: {o["index"]: o for o in x.operators if "index" in o} for p, x in
          (("before", before), ("after", after))}
    kinds = {o["type"] for o in after.operators}
    assert {"MatMul", "Softmax"} <= kinds
    for i, o in by["after"].items():
        if o["type"] == "MatMul" and seq.load[i, spec_sheet._L["params"]] == 0:  # no weights
            assert o["ms"] == pytest.approx(by["before"][i]["ms"])
        if o["type"] == "Softmax":  # every kernel at least the fixed cost, and repriced
            assert o["ms"] >= FIXED_MS and o["ms"] != pytest.approx(by["before"][i]["ms"])
    ms = streaming.ms(constants, ["add", "linear"], [(1, 1 << 20), (1, 64, 64, 64)],
                      [h100] * 2, streamed=False)
    assert np.isnan(ms[1]) and ms[0] > FIXED_MS
    alone = streaming.ms(constants, ["add"], [(1, 1 << 20)], [h100], streamed=True)
    assert alone[0] == pytest.approx(ms[0] - constants["elementwise"]["fixed_ms"])
