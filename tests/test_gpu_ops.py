"""The GPU operator model: the work of an operator, the roofline, the split of NeuSight's
public measurements (the unseen GPUs never fitted), and a fit that carries to another GPU."""

import math
from pathlib import Path

import numpy as np
import pytest

from mdot_jax.data import gpus, neusight
from mdot_jax.models.gpu_ops import GpuOpModel, features, roofline_ms, work

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
    with pytest.raises(ValueError, match="unknown operator 'conv'"):
        work("conv", (1, 2))


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
    np.testing.assert_allclose(GpuOpModel.load(tmp_path / "m.json.xz").predict(o, d, g), pred)
