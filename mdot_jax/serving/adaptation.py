"""Adapting a checkpoint to another device from a few measured step times.

A base checkpoint predicts `t` for its own device; the adapted one predicts
`exp(a + b * log t)` for the new device, fitted on rows the user measured there (their own
precision, optimizer and software, which the fit absorbs as well as the device). Two fits are
scored by leave-one-out on the rows, and the better one is kept:
- `scale`: b = 1, a = mean log ratio (one factor for every model);
- `affine`: a and b by least squares on log times (the new device may favour small or large
  workloads), only with >= 6 rows spanning a 2x range of predicted times.
The leave-one-out residuals give the expected error and the 80% band; with 10 rows both are
rough, and say so (`n_rows`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from mdot_jax.serving.calibration import COVER

MIN_AFFINE_ROWS = 6
MIN_AFFINE_SPREAD = float(np.log(2.0))  # of log predicted times, max - min


@dataclass(frozen=True)
class Adaptation:
    device: str  # the device the adapted checkpoint predicts for
    fit: str  # scale | affine
    a: float
    b: float
    n_rows: int
    loo_mape: float  # percent: each row predicted by a fit on the others
    lo: float  # 10th / 90th percentile of the leave-one-out log(measured / predicted)
    hi: float
    source: str = ""

    def apply(self, ms: np.ndarray) -> np.ndarray:
        """`[N]` base predictions (ms) -> `[N]` predictions for `device` (ms)."""
        return np.exp(self.a + self.b * np.log(np.asarray(ms, np.float64)))

    def interval(self, ms: float) -> tuple[float, float]:
        return ms * float(np.exp(self.lo)), ms * float(np.exp(self.hi))

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> Adaptation:
        return cls(**d)


def _solve(x: np.ndarray, y: np.ndarray, fit: str) -> tuple[float, float]:
    if fit == "scale":
        return float(np.mean(y - x)), 1.0
    b, a = np.polyfit(x, y, 1)
    return float(a), float(b)


def fit(pred_ms, measured_ms, device: str, source: str = "") -> Adaptation:
    """The adaptation of base predictions `pred_ms` `[N]` to `measured_ms` `[N]`."""
    x = np.log(np.asarray(pred_ms, np.float64))
    y = np.log(np.asarray(measured_ms, np.float64))
    n = len(x)
    if n < 2:
        raise ValueError(f"adapting needs at least 2 measured rows, got {n}")
    fits = ["scale"]
    if n >= MIN_AFFINE_ROWS and np.ptp(x) >= MIN_AFFINE_SPREAD:
        fits.append("affine")
    scored = []
    for kind in fits:
        loo = np.empty(n)
        for i in range(n):
            keep = np.arange(n) != i
            a, b = _solve(x[keep], y[keep], kind)
            loo[i] = y[i] - (a + b * x[i])  # log(measured / predicted)
        scored.append((float(np.mean(np.abs(np.expm1(-loo))) * 100), kind, loo))
    score, kind, loo = min(scored, key=lambda t: t[0])
    a, b = _solve(x, y, kind)
    lo, hi = np.quantile(loo, [(1 - COVER) / 2, (1 + COVER) / 2])
    return Adaptation(device, kind, a, b, n, score, float(lo), float(hi), source)
