"""The plan-choice study (`benchmarks/bench_plan_choice.py`): the groups of the Megatron host's
calibration models are kept apart from the held-out ones, and the scores are what they say."""

import pytest
from benches import bench

choice = bench("bench_plan_choice")


def _row(key, hidden, layers, tp, dp, pp, mb, ms, gpus=8):
    return dict(key=key, multi=False, gpus=gpus, global_batch=64, mb=mb, hidden=hidden,
                heads=16, layers=layers, seq=1024, tp=tp, dp=dp, pp=pp, ms=ms)


def test_calibration_models_apart_and_the_scores():
    rows = [_row("a", 1024, 12, 1, 8, 1, 8, 100.0), _row("b", 1024, 12, 2, 4, 1, 4, 90.0),
            _row("c", 1024, 12, 8, 1, 1, 1, 300.0),  # the host's calibration model
            _row("d", 1536, 16, 1, 8, 1, 8, 100.0), _row("e", 1536, 16, 2, 4, 1, 4, 90.0),
            _row("f", 1536, 16, 8, 1, 1, 1, 300.0),  # held out
            _row("g", 1536, 16, 1, 4, 1, 8, 50.0, gpus=4)]  # a group of one: left out
    predicted = dict(a=1, b=2, c=3, d=2, e=3, f=1, g=1)
    got = {g["calibration"]: g for g in choice.groups(rows, predicted)}
    assert set(got) == {True, False}
    cal, held = got[True], got[False]
    # calibration: the price picks a (100 ms) where b ran 90: a miss of 11%; least model
    # parallelism picks a too; the order of the other two is right
    assert not cal["hit"] and cal["regret"] == pytest.approx(100 / 90 - 1)
    assert cal["simple_regret"] == pytest.approx(100 / 90 - 1) and cal["rho"] == pytest.approx(0.5)
    # held out: every rank reversed, the slowest picked
    assert held["rho"] == pytest.approx(-1) and held["regret"] == pytest.approx(300 / 90 - 1)
    assert held["random_regret"] == pytest.approx((490 / 3) / 90 - 1)
