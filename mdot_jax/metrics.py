"""Accuracy metrics on milliseconds (every method in the evaluation uses these)."""

from __future__ import annotations

import numpy as np


def regression_metrics(pred_ms, true_ms) -> dict:
    """MAE and RMSE in ms; MAPE, median and p90 absolute percentage error in percent."""
    pred, true = np.asarray(pred_ms, np.float64), np.asarray(true_ms, np.float64)
    if pred.shape != true.shape or pred.size == 0:
        raise ValueError(f"need equal, non-empty shapes, got {pred.shape} and {true.shape}")
    err = pred - true
    ape = 100.0 * np.abs(err) / true
    return dict(mae_ms=float(np.abs(err).mean()), rmse_ms=float(np.sqrt((err ** 2).mean())),
                mape=float(ape.mean()), median_ape=float(np.median(ape)),
                p90_ape=float(np.percentile(ape, 90)), n=int(true.size))
