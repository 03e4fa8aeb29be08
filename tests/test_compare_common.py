"""The grown-dataset comparison (`benchmarks/compare_common.py`) scores both runs on the
samples both tested, pooling folds, and pairs ensemble members by seed."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

SPEC = importlib.util.spec_from_file_location(
    "compare_common", Path(__file__).parent.parent / "benchmarks" / "compare_common.py")
cc = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(cc)


def row(method, fold, seed, preds):
    return dict(method=method, fold=fold, seed=seed, test_keys=list(preds),
                pred_ms=list(preds.values()))


def test_compare_scores_common_samples_and_new_ones_apart():
    labels = {"a": 100.0, "b": 200.0, "c": 50.0}
    before = [row("gbm", 0, 0, {"a": 110.0}), row("gbm", 1, 0, {"b": 180.0})]
    after = [row("gbm", 0, 0, {"a": 100.0, "c": 75.0}), row("gbm", 1, 0, {"b": 210.0})]
    (r,) = cc.compare(before, after, labels, ["gbm"])
    assert (r["n_common"], r["n_new"]) == (2, 1)
    assert r["before"]["mape"] == pytest.approx(10.0)  # (10% + 10%) / 2
    assert r["after"]["mape"] == pytest.approx(2.5)  # (0% + 5%) / 2
    assert r["new_only"]["mape"] == pytest.approx(50.0)


def test_ensemble_is_the_geometric_mean_of_same_seed_members():
    rows = [row("x", 0, 0, {"a": 100.0}), row("y", 0, 0, {"a": 400.0}),
            row("x", 0, 1, {"a": 1.0})]  # seed 1 has no y: no ensemble for it
    assert cc.pooled(rows, "x+y") == {0: {"a": pytest.approx(200.0)}}
    labels = {"a": 200.0}
    (r,) = cc.compare(rows, rows, labels, ["x+y"])
    assert r["seed"] == 0 and np.isclose(r["after"]["mape"], 0.0)
