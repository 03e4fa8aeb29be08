"""The host issuing a step's kernels: the GPU runs them in order, each once issued and once
the one before it has ended (`spec_sheet.price`'s launch gaps; what `mdot adapt`'s machine form
fits, `serving.adaptation`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextvars import ContextVar

import numpy as np

_RECORDED: ContextVar[list[list[float]] | None] = ContextVar("recorded_kernels", default=None)


def launch_bound(kernels: Sequence[float], host_ms: float) -> float:
    """ms until the last of `kernels` (ms each, in order) ends when the host issues one every
    `host_ms` and the GPU runs them in order: a kernel starts once issued and once the one
    before it has ended, so end_k = max(k h, end_(k-1)) + t_k (`launch_bound_grid`'s closed
    form)."""
    return float(launch_bound_grid([kernels], np.ones(1), np.asarray([host_ms]))[0, 0, 0])


def waits(kernels: Sequence[float], host_ms: float, counts: Sequence[int]) -> list[float]:
    """ms the GPU has waited on the host when it ends the first n of `kernels` (ms each, in
    order), for each n of `counts`: `launch_bound`'s gaps of each prefix, in one pass."""
    t = np.asarray(kernels, np.float64)
    before = np.concatenate([[0.0], np.cumsum(t)[:-1]])  # [K] the GPU's work before each
    wait = np.maximum.accumulate(np.arange(1, len(t) + 1) * host_ms - before) if len(t) \
        else np.zeros(0)  # [K] the most a kernel so far was issued after the GPU was free
    return [max(float(wait[n - 1]), 0.0) if n else 0.0 for n in counts]


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


@contextlib.contextmanager
def recording_kernels() -> Iterator[list[list[float]]]:
    """Within it, every step `spec_sheet.price` prices adds its kernels' times (ms, in the order
    they run: `record`) to the list it yields (what `mdot adapt` fits a machine's form to)."""
    recorded: list[list[float]] = []
    token = _RECORDED.set(recorded)
    try:
        yield recorded
    finally:
        _RECORDED.reset(token)


def record(kernels: Sequence[float]) -> None:
    """A priced step's kernels (ms, in order), where `recording_kernels` records."""
    if (recorded := _RECORDED.get()) is not None:
        recorded.append(list(kernels))
