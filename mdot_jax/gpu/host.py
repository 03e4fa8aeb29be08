"""The host issuing a step's kernels: the GPU runs them in order, each once issued and once
the one before it has ended (`spec_sheet.price`'s launch gaps; what `mdot adapt`'s machine form
fits, `serving.adaptation`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def launch_bound(kernels: Sequence[float], host_ms: float) -> float:
    """ms until the last of `kernels` (ms each, in order) ends when the host issues one every
    `host_ms` and the GPU runs them in order: a kernel starts once issued and once the one
    before it has ended, so end_k = max(k h, end_(k-1)) + t_k (`launch_bound_grid`'s closed
    form)."""
    return float(launch_bound_grid([kernels], np.ones(1), np.asarray([host_ms]))[0, 0, 0])


def launch_bound_grid(kernels: Sequence[Sequence[float]], speeds: np.ndarray,
                      hosts: np.ndarray) -> np.ndarray:
    """`[N, S, H]` `launch_bound` of each step's kernels (ms, in order) at every factor of
    `speeds` `[S]` on their times and every host time `hosts` `[H]` (ms a kernel)."""
    out = np.empty((len(kernels), len(speeds), len(hosts)))
    for i, ks in enumerate(kernels):
        t = np.asarray(ks, np.float64)
        before = np.concatenate([[0.0], np.cumsum(t)[:-1]])  # [K] the GPU's work before each
        issued = np.arange(1, len(t) + 1)[:, None] * np.asarray(hosts)[None, :]  # [K, H]
        for s, speed in enumerate(speeds):
            wait = np.max(issued - speed * before[:, None], axis=0) if len(t) else 0.0  # [H]
            out[i, s] = speed * t.sum() + np.maximum(wait, 0.0)
    return out
