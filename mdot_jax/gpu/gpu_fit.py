"""Fits the GPU step model (`models.gpu_ops.StepModel`) on NeuSight's public measurements.

Only the GPUs NeuSight fits on (its training collections) are used; its test GPUs (H100, L4,
A100 80 GB) stay unseen. The band is that of whole steps on a GPU left out of the fit: each
training GPU's traced labels priced by the model fitted on the other GPUs' operators, and the
10th and 90th percentiles of log(measured / predicted) over all of them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from mdot_jax.gpu import catalog as gpus
from mdot_jax.gpu import neusight
from mdot_jax.gpu.gpu_ops import GpuOpModel, StepModel, StepPricer

SOURCE = ("NeuSight's public fp32 measurements (Lee, Phanishayee, Mahajan, ASPLOS 2025; MIT "
          "licence), read in place from ../shared/datasets/neusight")


def _fit(rows, seed: int) -> GpuOpModel:
    return GpuOpModel.fit([r.op for r in rows], [r.dims for r in rows],
                          [gpus.find(r.gpu) for r in rows], [r.ms for r in rows], seed=seed)


def fit(root: str | Path, *, seed: int = 0,
        progress: Callable[[str], None] = lambda s: None) -> StepModel:
    """The step model of NeuSight's training GPUs (`root`: the NeuSight folder)."""
    rows = [r for r in neusight.read(root) if r.split == "train"]
    seen = neusight.training_gpus(rows)
    labels = [x for x in neusight.labels(root) if x.gpu in seen]
    ratios = StepPricer.fit_ratios([x for x in labels if x.mode == "train"])
    progress(f"{len(rows)} operator rows and {len(labels)} traced labels of {seen}")
    residuals = []
    for held in seen:
        step = StepPricer(_fit([r for r in rows if r.gpu != held], seed).predict, ratios)
        for x in (x for x in labels if x.gpu == held):
            residuals.append(float(np.log(x.e2e_ms / step.predict(x, gpus.find(held))["e2e"])))
        progress(f"left out {held}: {len(residuals)} labels priced")
    band = (float(np.percentile(residuals, 10)), float(np.percentile(residuals, 90)))
    ops = _fit(rows, seed)
    return StepModel(ops, ratios, band, dict(
        fitted_gpus=seen, operator_rows=len(rows), band_labels=len(residuals),
        band_rule="10th-90th percentile of log(measured / predicted) of every traced label of "
                  "each fitted GPU, priced by a model fitted on the other GPUs",
        source=SOURCE, seed=seed))
