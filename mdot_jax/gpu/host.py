"""The host issuing a step's kernels: the GPU runs them in order, each once issued and once
the one before it has ended (`spec_sheet.price`'s launch gaps; what `mdot adapt`'s machine form
fits, `serving.adaptation`)."""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator, Sequence
from contextvars import ContextVar

import numpy as np

_RECORDED: ContextVar[list[list[float]] | None] = ContextVar("recorded_kernels", default=None)


def in_order(work: Sequence[tuple], ms: np.ndarray, recompute: Collection[int], nodes: int
             ) -> tuple[list[float], np.ndarray, np.ndarray, dict[str, float]]:
    """`work`'s kernels (`spec_sheet.Kernel`s: node, phase, ..., times what) at `ms` each:
    (their times as they run: the forward in node order, then the backward in reverse, a
    recomputed node's forward kernels just before its backward ones; `[nodes]` ms and kernels
    per node; ms per phase)."""
    timed = [(w[0], w[1], float(t) * w[5]) for w, t in zip(work, ms)]
    rerun = frozenset(recompute)
    again = [(i, "re", t) for i, phase, t in timed if phase == "fw" and i in rerun]
    order = [t for *_, t in sorted((x for x in timed if x[1] == "fw"), key=lambda x: x[0])
             + sorted([x for x in timed if x[1] == "bw"] + again,
                      key=lambda x: (-x[0], x[1] == "bw"))]
    per_op = np.zeros(nodes)
    phases = dict(forward=0.0, backward=0.0, update=0.0)
    for i, phase, t in timed:
        per_op[i] += t
        phases["forward" if phase == "fw" else "backward"] += t
    if again:
        phases["recomputation"] = sum(t for *_, t in again)
    kernels = np.bincount([i for i, *_ in timed + again], minlength=nodes)
    return order, per_op, kernels, phases


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


def stage_gaps(operators: Sequence[dict], stage: np.ndarray, pp: int) -> np.ndarray:
    """`[pp]` ms a micro-batch each pipeline stage's GPU waits on its host, of a one-GPU
    step's launch gaps (`operators` as `spec_sheet.price` gives them: each node's `ms` and
    `kernels`, the gaps' `ms` and `host_ms` a kernel; `stage`: each node's stage). Each stage's
    process issues its own kernels: the gaps go to the stages whose host issues more than
    their GPU runs, by how much more (where none does, by their kernels)."""
    nodes = [o for o in operators if "index" in o]
    gaps = next((o for o in operators if o["type"] == "launch gaps"), None)
    if gaps is None or not nodes:
        return np.zeros(pp)
    at = stage[[o["index"] for o in nodes]]
    gpu = np.bincount(at, [o["ms"] for o in nodes], pp)  # [pp] ms
    kernels = np.bincount(at, [o.get("kernels", 1) for o in nodes], pp)  # [pp]
    deficit = np.maximum(kernels * gaps.get("host_ms", 0.0) - gpu, 0.0)  # [pp] ms
    split = deficit if deficit.sum() > 0 else kernels
    return gaps["ms"] * split / max(split.sum(), 1e-30)


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
