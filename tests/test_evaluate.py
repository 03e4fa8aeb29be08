"""Evaluation harness: every baseline fits and predicts on a tiny real dataset, on identical
folds; results resume; summary files are written."""

import json

import numpy as np

from mdot_jax.evaluate import _read, run, summarize
from mdot_jax.train import TrainConfig

METHODS = ["lightgbm", "mlp", "analytic", "roofline", "per_op", "gnn", "lstm",
           "mdot-pe-distance_bias"]


def test_every_method_on_identical_folds(tiny_real_dataset, tmp_path):
    budget = TrainConfig(epochs=1, tokens_per_batch=2048)
    rows = run(tiny_real_dataset, tmp_path, split="family", folds=2, methods=METHODS,
               budget=budget, progress=False)
    assert len(rows) == 2 * len(METHODS)
    for fold in (0, 1):
        keys = {tuple(r["test_keys"]) for r in rows if r["fold"] == fold}
        assert len(keys) == 1  # every method was tested on the same samples
    for r in rows:
        assert len(r["pred_ms"]) == len(r["test_keys"])
        assert np.all(np.isfinite(r["pred_ms"])) and min(r["pred_ms"]) > 0, r["method"]
        assert r["metrics"]["mape"] >= 0
    # resuming runs nothing again
    before = (tmp_path / "results.jsonl").read_text()
    run(tiny_real_dataset, tmp_path, split="family", folds=2, methods=METHODS, budget=budget,
        progress=False)
    assert (tmp_path / "results.jsonl").read_text() == before
    result = summarize(_read(tmp_path / "results.jsonl"), tiny_real_dataset, tmp_path, "cmd")
    assert set(result["methods"]) == set(METHODS)
    assert {"mae_ms", "rmse_ms", "mape"} <= set(result["methods"]["gnn"])
    assert json.loads((tmp_path / "results.json").read_text())["command"] == "cmd"
    assert (tmp_path / "pred_vs_measured.png").stat().st_size > 0
    assert (tmp_path / "error_by_family.png").stat().st_size > 0
    assert "| lightgbm |" in (tmp_path / "table.md").read_text()
