"""Error bands from held-out predictions (`mdot_jax.storage.calibration`)."""

import numpy as np
import pytest

from mdot_jax.data.dataset import Sample, Workload
from mdot_jax.storage import calibration
from mdot_jax.storage.calibration import Calibration


def _held_out(n=1000, seed=0):
    """Predictions whose error grows with the members' disagreement, as on the timm folds."""
    rng = np.random.default_rng(seed)
    disagreement = rng.uniform(0, 0.5, n)
    measured = rng.uniform(10, 1000, n)
    log_err = rng.normal(0, 0.05 + disagreement)  # log(measured / predicted)
    return measured / np.exp(log_err), measured, disagreement, log_err


def test_bands_hold_their_share_and_widen_with_disagreement():
    pred, measured, d, log_err = _held_out()
    bands = calibration.fit_bands(pred, measured, d)
    cal = Calibration({"nchw": bands}, ("a", "b"))
    assert [b.n for b in bands] == [500, 400, 100]
    assert bands[0].upto == np.sort(d)[499] and bands[-1].upto is None  # observed values
    widths = [b.hi - b.lo for b in bands]
    assert widths[0] < widths[1] < widths[2]
    assert bands[0].median_ape < bands[2].median_ape
    lo, hi = np.transpose([cal.interval(p, "nchw", x) for p, x in zip(pred, d)])
    inside = (lo <= measured) & (measured <= hi)
    assert inside.mean() == pytest.approx(calibration.COVER, abs=0.01)
    top = d > bands[1].upto
    assert inside[top].mean() == pytest.approx(calibration.COVER, abs=0.02)
    assert cal.band("nchw", 0.0) is bands[0] and cal.band("nchw", 10.0) is bands[-1]
    assert cal.band("nhwc", 0.0) is None and cal.interval(1.0, "nhwc") is None
    assert cal.labels("nchw")[0].startswith("<= ") and cal.labels("nchw")[-1].startswith("> ")
    assert Calibration.from_json(cal.to_json()) == cal


def test_one_member_has_one_band():
    pred, measured, _, log_err = _held_out()
    cal = Calibration({"nchw": calibration.fit_bands(pred, measured, None)}, ("a",))
    (band,) = cal.bands["nchw"]
    assert cal.labels("nchw") == ["any"]
    assert band.lo == pytest.approx(np.quantile(log_err, 0.1))
    assert cal.interval(100.0, "nchw") == pytest.approx((100 * np.exp(band.lo),
                                                         100 * np.exp(band.hi)))


def test_from_results_per_layout_geometric_mean_lowest_seed():
    samples = [Sample(f"k{i}", "m", "", Workload(8, 64, layout=("nchw", "nhwc")[i % 2]),
                      label_ms=100.0 + i) for i in range(80)]
    keys = [s.key for s in samples]
    rows = [dict(method="a", seed=0, test_keys=keys[:40], pred_ms=[50.0] * 40),
            dict(method="a", seed=0, test_keys=keys[40:], pred_ms=[200.0] * 40),
            dict(method="a", seed=1, test_keys=keys, pred_ms=[1.0] * 80),
            dict(method="b", seed=0, test_keys=keys, pred_ms=[200.0] * 80)]
    cal = calibration.from_results(rows, samples, ("a", "b"))
    assert sorted(cal.bands) == ["nchw", "nhwc"]
    for layout, bands in cal.bands.items():
        assert sum(b.n for b in bands) == 40
        # half the samples: members 50 and 200 (geometric mean 100, disagreement log 4)
        assert bands[-1].upto is None and cal.band(layout, np.log(4)).n == 20
    one = calibration.from_results(rows, samples, ("a", "b"), binned=False)
    assert [len(b) for b in one.bands.values()] == [1, 1]
    with pytest.raises(ValueError, match="no results of 'c'"):
        calibration.from_results(rows, samples, ("a", "c"))
    # three members: binned by their spread, max |log(t_i / t_j)| (here still 50 vs 200)
    three = calibration.from_results(rows, samples, ("a", "b", "a"))
    assert three.bands["nchw"][-1].n == 20 and three.band("nchw", np.log(4)).n == 20
    with pytest.raises(ValueError, match="one to three methods"):
        calibration.from_results(rows, samples, ("a", "b", "a", "b"))
