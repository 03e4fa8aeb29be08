"""The Flax kernel model: never faster than the roofline, fractions of peak in (0, 1), a
fit that learns a tensor-core table, an Orbax round trip, and the table's reader."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from mdot_jax.gpu import catalog as gpus
from mdot_jax.gpu import xla_tables
from mdot_jax.gpu.gpu_ops import StepModel
from mdot_jax.gpu.kernel_model import FEATURES, KernelModel, features, on_tensor_cores
from mdot_jax.gpu.neusight import OPS
from mdot_jax.gpu.work import roofline_ms

TABLES = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "xla-h100-tables"


def _rows(gpu, n=400, seed=0):
    """GEMMs and adds whose time is a known fraction of the roofline plus 10 us."""
    rng = np.random.default_rng(seed)
    ops, dims = [], []
    for _ in range(n):
        if rng.random() < 0.5:
            ops.append("bmm")
            dims.append(tuple(int(2 ** rng.integers(4, 12)) for _ in range(4)))
        else:
            ops.append("add")
            dims.append((int(2 ** rng.integers(0, 10)), int(2 ** rng.integers(8, 16))))
    ms = [roofline_ms(o, d, gpu) / (0.7 if o == "bmm" else 0.8) + 0.01 for o, d in zip(ops, dims)]
    return ops, dims, [gpu] * n, ms


def test_tensor_cores_are_told_apart_by_the_peak_a_kernel_sees():
    h100, rtx = gpus.find("h100-sxm"), gpus.find("rtx 3090")
    bf16 = gpus.as_seen(h100, h100.tflops["bf16"], 2)
    x, compute, memory, tensor = features(["bmm", "bmm"], [(1, 512, 512, 512)] * 2,
                                          [h100, bf16])
    assert tensor.tolist() == [0.0, 1.0] and x.shape[1] == len(OPS) + len(FEATURES)
    assert compute[1] < compute[0] / 10 and memory[1] == pytest.approx(memory[0] / 2)
    # the RTX 3090's TF32 peak is its CUDA cores' fp32 one: not a tensor core's
    assert not on_tensor_cores(gpus.as_seen(rtx, rtx.tflops["tf32"], 4))
    assert on_tensor_cores(gpus.as_seen(rtx, rtx.tflops["fp16"], 2))


@pytest.mark.slow
def test_a_fit_is_bounded_by_the_roofline_and_round_trips(tmp_path):
    v100 = gpus.find("v100 pcie 32gb")
    ops, dims, seen, ms = _rows(v100)
    model = KernelModel.fit(ops, dims, seen, ms, steps=400, batch=256)
    parts = model.parts(ops, dims, seen)
    roof = np.asarray([roofline_ms(o, d, g) for o, d, g in zip(ops, dims, seen)])
    assert (parts["ms"] >= roof).all()  # never faster than the roofline
    for k in ("u_compute", "u_memory"):
        assert ((parts[k] > 0) & (parts[k] < 1)).all()
    assert (parts["launch_ms"] < 0.05).all()
    assert np.median(np.abs(parts["ms"] / np.asarray(ms) - 1)) < 0.25  # it learned something
    # a GPU it never saw, 10x the peak: faster, and still above its roofline
    fast = dataclasses.replace(v100, tflops=dict(v100.tflops, fp32=140.0))
    big = (["bmm"], [(1, 4096, 4096, 4096)])
    assert model.predict(*big, [fast])[0] < model.predict(*big, [v100])[0]
    assert model.predict(*big, [fast])[0] >= roofline_ms("bmm", big[1][0], fast)
    # tensor cores it never saw: no slower than the CUDA cores, whatever the network says
    tc = gpus.as_seen(v100, v100.tflops["fp16"], 2)
    cuda = dataclasses.replace(tc, tflops=dict(tc.tflops, fp32=v100.tflops["fp32"]))
    assert model.predict(*big, [tc])[0] <= model.predict(*big, [cuda])[0] * (1 + 1e-6)
    step = StepModel(model, {}, (-0.1, 0.1), dict(pricer="kernel"))
    step.save(tmp_path / "m")
    back = StepModel.load(tmp_path / "m")
    assert isinstance(back.ops, KernelModel)
    np.testing.assert_allclose(back.ops.predict(ops, dims, seen), parts["ms"], rtol=1e-5)


@pytest.mark.skipif(not TABLES.is_dir(), reason="no ../shared/datasets")
def test_the_xla_table_is_read_as_the_h100_at_its_precision(tmp_path):
    ops, dims, seen, ms = xla_tables.matmuls(TABLES)
    assert len(ops) == 750 and set(ops) == {"bmm"}
    peaks = {g.tflops["fp32"] for g in seen}
    h100 = gpus.find("h100-sxm")
    assert peaks == {h100.tflops["bf16"], h100.tflops["tf32"]}
    # measured, so never faster than the peak it ran at
    assert all(ms_ >= roofline_ms("bmm", d, g) for d, g, ms_ in zip(dims, seen, ms))
    bad = tmp_path / "matmul.csv"
    bad.write_text("gpu_key,b,m,n,k,dtype,flops_per_s\nsm_90,1,2,2,2,f8xf8->f8,1\n")
    with pytest.raises(ValueError, match=r"matmul.csv:2: dtype 'f8xf8->f8'"):
        xla_tables.matmuls(tmp_path)
