import pytest

from mdot_jax.metrics import regression_metrics


def test_metrics_hand_computed():
    m = regression_metrics([110.0, 45.0, 3.0], [100.0, 50.0, 2.0])
    assert m["mae_ms"] == pytest.approx((10 + 5 + 1) / 3)
    assert m["rmse_ms"] == pytest.approx(((100 + 25 + 1) / 3) ** 0.5)
    assert m["mape"] == pytest.approx((10 + 10 + 50) / 3)
    assert m["median_ape"] == pytest.approx(10.0) and m["n"] == 3
    with pytest.raises(ValueError):
        regression_metrics([1.0], [1.0, 2.0])
