"""Fits the GPU step model (`gpu_ops.StepModel`) on public measurements: NeuSight's fp32
operators of its five training GPUs and, where given, XLA's H100 tensor-core GEMM table.

NeuSight's test GPUs (H100, L4, A100 80 GB) stay out of NeuSight's rows. The band is that of
whole steps on a GPU left out of the fit: each training GPU's traced labels priced by the model
fitted on the other GPUs' operators (and the tensor-core table), and the 10th and 90th
percentiles of log(measured / predicted) over all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from mdot_jax.gpu import catalog as gpus
from mdot_jax.gpu import neusight, xla_tables
from mdot_jax.gpu.gpu_ops import SPLIT_DEPTH, GpuOpModel, StepModel, StepPricer
from mdot_jax.gpu.kernel_model import KernelModel

SOURCE = ("NeuSight's public fp32 measurements (Lee, Phanishayee, Mahajan, ASPLOS 2025; MIT "
          "licence), read in place from ../shared/datasets/neusight")
# the operator pricers a step model can hold: fit(ops, dims, gpus, ms, weights, seed)
PRICERS: dict[str, Callable] = {  # keyed by options.GPU_PRICERS
    "kernel": lambda *a, weights, seed: KernelModel.fit(*a, weights=weights, seed=seed),
    "trees": lambda *a, weights, seed: GpuOpModel.fit(*a, seed=seed),
}
# a table of another precision is drawn this often in the kernel model's batches, whatever
# its size next to NeuSight's quarter of a million fp32 rows
TABLE_SHARE = 0.1


def columns(rows, extra=None) -> tuple[list, list, list, list, np.ndarray]:
    """(ops, dims, GPUs as seen, ms, draw weights) of NeuSight `rows` and an `extra` table
    (`xla_tables.matmuls`), the table drawn `TABLE_SHARE` of the time."""
    ops, dims = [r.op for r in rows], [r.dims for r in rows]
    seen, ms = [gpus.find(r.gpu) for r in rows], [r.ms for r in rows]
    weights = np.ones(len(rows))
    if extra and extra[0]:
        share = TABLE_SHARE * len(rows) / ((1 - TABLE_SHARE) * len(extra[0]))
        ops, dims, seen, ms = ops + extra[0], dims + extra[1], seen + extra[2], ms + extra[3]
        weights = np.concatenate([weights, np.full(len(extra[0]), share)])
    return ops, dims, seen, ms, weights


def fit(root: str | Path, *, tables: str | Path | None = None, pricer: str = "trees",
        seed: int = 0, progress: Callable[[str], None] = lambda s: None) -> StepModel:
    """The step model of NeuSight's training GPUs (`root`: the NeuSight folder), with XLA's
    tensor-core GEMMs (`tables`: the xla-h100-tables folder) where given."""
    if pricer not in PRICERS:
        raise ValueError(f"pricer {pricer!r}: choose from {list(PRICERS)}")
    rows = [r for r in neusight.read(root) if r.split == "train"]
    seen = neusight.training_gpus(rows)
    extra = xla_tables.matmuls(tables) if tables else None
    labels = [x for x in neusight.labels(root) if x.gpu in seen]
    ratios = StepPricer.fit_ratios([x for x in labels if x.mode == "train"])
    progress(f"{len(rows)} operator rows and {len(labels)} traced labels of {seen}"
             + (f"; {len(extra[0])} tensor-core GEMMs of the H100" if extra else ""))

    def fitted(rs):
        *cols, weights = columns(rs, extra)
        return PRICERS[pricer](*cols, weights=weights, seed=seed)

    residuals = []
    for held in seen:
        step = StepPricer(fitted([r for r in rows if r.gpu != held]).predict, ratios)
        for x in (x for x in labels if x.gpu == held):
            residuals.append(float(np.log(x.e2e_ms / step.predict(x, gpus.find(held))["e2e"])))
        progress(f"left out {held}: {len(residuals)} labels priced")
    band = (float(np.percentile(residuals, 10)), float(np.percentile(residuals, 90)))
    sources = [SOURCE] + ([xla_tables.SOURCE] if extra else [])
    return StepModel(fitted(rows), ratios, band, dict(
        pricer=pricer, fitted_gpus=seen + ([xla_tables.GPU_NAME] if extra else []),
        operator_rows=len(rows) + (len(extra[0]) if extra else 0), band_labels=len(residuals),
        band_rule="10th-90th percentile of log(measured / predicted) of every traced label of "
                  "each fitted GPU, priced by a model fitted on the other GPUs",
        source="; ".join(sources), seed=seed, split_gemms=SPLIT_DEPTH,
        tensor_cores={xla_tables.GPU_NAME: sorted({p for p, _ in xla_tables.DTYPES.values()})}
        if extra else {}))


HOST_GRID = np.geomspace(1e-3, 0.3, 61)  # ms: the host's time per kernel, 1 us to 300 us


def step_kernels(model: StepModel, samples: Sequence, gpu: gpus.GPU
                 ) -> list[tuple[list[float], float]]:
    """(the GPU's kernel times in the order they run, the measured ms) of each sample of eager
    PyTorch on `gpu`, priced by `model` at its own precision with SGD (the kit's and timm's
    optimizer) behind a host, whose speed changes only the gaps (`host.launch_bound`)."""
    from mdot_jax.gpu.spec_sheet import price

    out = []
    for s in samples:
        kernels: list[float] = []
        price(s.seq, gpu, model, precision=s.workload.precision, step="train",
              optimizer="sgd", fit=False, host_ms=float(HOST_GRID[0]), kernels=kernels,
              layout=s.workload.layout)
        out.append((kernels, s.label_ms))
    return out


def best_host(steps: Sequence[tuple[list[float], float]]) -> tuple[float, float, float]:
    """(the host's ms per kernel of `HOST_GRID` of the least MAPE over `steps` (`step_kernels`),
    that MAPE in %, the MAPE at the grid's fastest host)."""
    from mdot_jax.gpu.host import launch_bound

    mape = [np.mean([abs(launch_bound(k, h) / ms - 1) for k, ms in steps]) for h in HOST_GRID]
    i = int(np.argmin(mape))
    return float(HOST_GRID[i]), float(100 * mape[i]), float(100 * mape[0])


def fit_host(model: StepModel, datasets: list[str], device: str, *,
             progress: Callable[[str], None] = lambda s: None) -> float:
    """The host's time to issue a kernel (ms) that best explains measured whole steps of eager
    PyTorch on `device` (`datasets`: samples of `mdot profile` or the GPU kit, resequenced with
    fusion): of `HOST_GRID`, the one of the least MAPE (`best_host`)."""
    from mdot_jax.data.dataset import load_dataset

    steps = step_kernels(model, [s for d in datasets for s in load_dataset(d).samples],
                         gpus.find(device))
    best, mape, fastest = best_host(steps)
    progress(f"host time per kernel {1e3 * best:.1f} us: MAPE {mape:.1f}% over {len(steps)} "
             f"steps of {', '.join(datasets)} (at 1 us: {fastest:.1f}%)")
    return best
