"""Error bands from held-out predictions (`mdot_jax.calibration`)."""

import numpy as np
import pytest

from mdot_jax import calibration
from mdot_jax.calibration import Calibration


def _held_out(n=1000, seed=0):
    """Predictions whose error grows with the members' disagreement, as on the timm folds."""
    rng = np.random.default_rng(seed)
    disagreement = rng.uniform(0, 0.5, n)
    measured = rng.uniform(10, 1000, n)
    log_err = rng.normal(0, 0.05 + disagreement)  # log(measured / predicted)
    return measured / np.exp(log_err), measured, disagreement, log_err


def test_bands_hold_their_share_and_widen_with_disagreement():
    pred, measured, d, log_err = _held_out()
    cal = calibration.fit(pred, measured, d, ("a", "b"))
    assert [b.n for b in cal.bands] == [500, 400, 100]
    assert cal.bands[0].upto == np.sort(d)[499]  # an observed value
    assert cal.bands[-1].upto is None
    widths = [b.hi - b.lo for b in cal.bands]
    assert widths[0] < widths[1] < widths[2]
    assert cal.bands[0].median_ape < cal.bands[2].median_ape
    lo, hi = np.transpose([cal.interval(p, x) for p, x in zip(pred, d)])
    inside = (lo <= measured) & (measured <= hi)
    assert inside.mean() == pytest.approx(calibration.COVER, abs=0.01)
    top = d > cal.bands[1].upto
    assert inside[top].mean() == pytest.approx(calibration.COVER, abs=0.02)
    assert cal.band(0.0) is cal.bands[0] and cal.band(10.0) is cal.bands[-1]
    assert cal.labels()[0].startswith("<= ") and cal.labels()[-1].startswith("> ")
    assert Calibration.from_json(cal.to_json()) == cal


def test_one_member_has_one_band():
    pred, measured, _, log_err = _held_out()
    cal = calibration.fit(pred, measured, None, ("a",))
    assert len(cal.bands) == 1 and cal.labels() == ["any"]
    assert cal.bands[0].lo == pytest.approx(np.quantile(log_err, 0.1))
    assert cal.interval(100.0) == pytest.approx((100 * np.exp(cal.bands[0].lo),
                                                 100 * np.exp(cal.bands[0].hi)))


def test_from_results_takes_the_geometric_mean_and_the_lowest_seed():
    keys = [f"k{i}" for i in range(40)]
    measured = {k: 100.0 + i for i, k in enumerate(keys)}
    rows = [dict(method="a", seed=0, test_keys=keys[:20], pred_ms=[50.0] * 20),
            dict(method="a", seed=0, test_keys=keys[20:], pred_ms=[200.0] * 20),
            dict(method="a", seed=1, test_keys=keys, pred_ms=[1.0] * 40),
            dict(method="b", seed=0, test_keys=keys, pred_ms=[200.0] * 40)]
    cal = calibration.from_results(rows, measured, ("a", "b"))
    assert sum(b.n for b in cal.bands) == 40
    # half the samples: members 50 and 200 (geometric mean 100, disagreement log 4)
    assert cal.bands[-1].upto is None and cal.band(np.log(4)).n == 20
    assert len(calibration.from_results(rows, measured, ("a", "b"), binned=False).bands) == 1
    with pytest.raises(ValueError, match="no results of 'c'"):
        calibration.from_results(rows, measured, ("a", "c"))
    with pytest.raises(ValueError, match="one method or two"):
        calibration.from_results(rows, measured, ("a", "b", "a"))
