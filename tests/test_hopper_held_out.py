"""The held-out Hopper models (`benchmarks/bench_hopper_held_out.py`, docs/studies/
hopper-held-out.md): nothing a held-out GPU's price uses was measured on that GPU."""

import pytest
from benches import bench

from mdot_jax.gpu import catalog
from mdot_jax.measure import kernel_sweep


@pytest.mark.parametrize("held", ["h100 sxm", "h200 sxm"])
def test_a_held_out_gpus_constants_come_from_the_other_gpu(held):
    module = bench("bench_hopper_held_out")
    other = module.OTHER[held]
    info = module.held_out_info(held, kernel_sweep.read(module.SWEEPS[other]))
    # every constant the shipped model measured on `held` is replaced, and by `other`'s fit
    measured_here = {k for k, v in module.shipped_info().items()
                     if isinstance(v, dict) and catalog.lookup(str(v.get("gpu"))) ==
                     catalog.find(held)}
    assert measured_here and measured_here <= set(info)
    for key, v in info.items():
        assert v is None or catalog.find(v["gpu"]) == catalog.find(other), key
    if held == "h100 sxm":  # a sweep's fitted fixed cost is its call's: none kept
        assert all(c["fixed_ms"] == 0.0 for c in info["tensor_core_gemms"]["constants"].values())
