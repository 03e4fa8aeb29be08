"""GEMMs on tensor cores at a measured share of the spec sheet's peak.

A GEMM at a tensor-core arithmetic (`half`: fp16 and bf16; `tf32`) takes

    t = fixed + max(FLOPs / (share_c peak), bytes / (share_m bandwidth))

on any GPU with that peak: the roofline's two times, each at the share of the datasheet figure
that large kernels reach, plus a fixed cost per kernel (its ramp-up and tail, which dominates
small GEMMs). Three constants per arithmetic, fitted (least squares of log time) on XLA's
measured H100 GEMMs (`xla_tables`): the bf16 rows for `half`, the f32 rows (TF32 on Hopper) for
`tf32`. That the shares carry to other GPUs is the assumption; the fit says how well the form
explains the table itself (`mape`).

Wave quantisation is not in the form: over the table's shapes (multiples of 256) it made the
fit worse, cuBLAS choosing its tiles and split-K per shape.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from mdot_jax.gpu import catalog, xla_tables
from mdot_jax.gpu.catalog import GPU
from mdot_jax.gpu.work import work

# the spec sheet's peak of each precision -> the arithmetic whose constants price it
ARITHMETIC = {"fp16": "half", "bf16": "half", "tf32": "tf32"}
GEMM_OPS = ("linear", "bmm")


@dataclass(frozen=True)
class Constants:
    share_compute: float  # of the peak, (0, 1]
    share_memory: float  # of the bandwidth, (0, 1]
    fixed_ms: float
    rows: int  # measured GEMMs fitted
    mape: float  # % over those rows

    def ms(self, op: str, dims: Sequence[int], seen: GPU) -> float:
        """`seen`: the GPU as the kernel sees it (`catalog.as_seen`: the tensor-core peak as
        its `fp32`, the bandwidth scaled to the element width)."""
        flops, moved, *_ = work(op, dims)
        return self.fixed_ms + 1e3 * max(
            flops / (self.share_compute * seen.tflops["fp32"] * 1e12),
            moved / (self.share_memory * seen.memory_gbs * 1e9))


@dataclass(frozen=True)
class TensorCoreGemms:
    """Per arithmetic (`ARITHMETIC`'s values), the constants; `gpu` the catalog's name of the
    GPU they were measured on, `source` the data."""

    constants: dict[str, Constants]
    gpu: str
    source: str

    def ms(self, peak: str, ops: Sequence[str], dims: Sequence[Sequence[int]],
           seen: Sequence[GPU]) -> np.ndarray:
        """`[N]` ms of GEMMs at the spec sheet's `peak` (fp16, bf16, tf32)."""
        c = self.constants[ARITHMETIC[peak]]
        return np.asarray([c.ms(o, d, g) for o, d, g in zip(ops, dims, seen)], np.float64)

    def to_json(self) -> dict:
        return dict(constants={k: asdict(v) for k, v in self.constants.items()},
                    gpu=self.gpu, source=self.source)

    @classmethod
    def from_json(cls, d: dict) -> TensorCoreGemms:
        return cls({k: Constants(**v) for k, v in d["constants"].items()}, d["gpu"],
                   d["source"])

    @classmethod
    def fit(cls, tables: str | Path, source: str = xla_tables.SOURCE) -> TensorCoreGemms:
        """Fitted on an XLA table of one GPU's GEMMs in `tables` (the xla-h100-tables folder,
        or a folder of the same `matmul.csv` columns); `source`: where its rows come from."""
        ops, dims, seen, ms, peaks = xla_tables.matmuls(tables, with_peaks=True)
        one_gpu({g.name for g in seen}, "GEMMs of an XLA table", "one gpu_key")
        constants = {}
        for arithmetic in sorted(set(ARITHMETIC.values())):
            at = [i for i, p in enumerate(peaks) if ARITHMETIC[p] == arithmetic]
            if at:
                constants[arithmetic] = _fit([ops[i] for i in at], [dims[i] for i in at],
                                             [seen[i] for i in at], [ms[i] for i in at])
        return cls(constants, seen[0].name, source)


def cube(mnk: float) -> tuple[int, int, int, int]:
    """A GEMM of `mnk` multiply-adds (2 mnk FLOPs) that writes nothing large: (1, s, s, s)."""
    side = max(round(mnk ** (1 / 3)), 1)
    return 1, side, side, side


def fit_sweep_gemms(rows: Sequence[dict], precision: str) -> dict:
    """A lent GPU's measured GEMMs and batched GEMMs at `precision` (a kernel sweep's `gemm`
    and `bmm` rows, `measure.kernel_sweep`: fp8 through `torch._scaled_mm`, scaled per tensor,
    a 16-bit output) fitted at its spec sheet's peak for it, on elements of its width: the
    shares of the peak and the bandwidth, as a step model's `fp8_gemms` holds them. The fitted
    fixed cost holds the sweep's own call and is kept for the record only."""
    width = {"fp8": 1, "fp16": 2, "bf16": 2, "tf32": 4}[precision]
    items = []
    for r in rows:
        if r.get("kind") in ("gemm", "bmm") and r.get("precision") == precision and r.get("ms"):
            gpu = catalog.find(r["device"])
            if not gpu.tflops.get(precision):
                raise ValueError(f"{gpu.name}: no {precision} peak on its spec sheet")
            items.append(("linear" if r["kind"] == "gemm" else "bmm", tuple(r["dims"]),
                          catalog.as_seen(gpu, gpu.tflops[precision], width), float(r["ms"])))
    c, gpu = _fit_one_gpu(items, f"{precision} GEMMs", "kinds gemm, bmm")
    return dict(share_compute=c.share_compute, share_memory=c.share_memory,
                fixed_ms=c.fixed_ms, rows=c.rows, mape=c.mape, gpu=gpu.name)


def fit_fused_attention(rows: Sequence[dict], kind: str = "sdpa-flash") -> dict:
    """A lent GPU's measured SDPA kernels of one backend (forward and backward, causal: a
    kernel sweep's `kind` rows, `sdpa-flash` or `sdpa-efficient`, `measure.kernel_sweep`) as
    GEMM cubes of their FLOPs (7 b h s (s / 2) d, as `spec_sheet.fused_attention` counts
    them), fitted: the share of the peak that kernel reaches on that GPU's architecture, as a
    step model's `fused_attention` holds it. The fitted fixed cost holds the sweep's own call
    (a sum and an autograd backward) and is kept for the record only."""
    items = []
    for r in rows:
        if r.get("kind") != kind or not r.get("ms"):
            continue
        b, h, s, d = r["dims"]
        gpu = catalog.find(r["device"])
        items.append(("linear", attention_cube(b * h, s, d),
                      catalog.as_seen(gpu, gpu.tflops[r["precision"]], 2), float(r["ms"])))
    c, gpu = _fit_one_gpu(items, f"SDPA {kind.removeprefix('sdpa-')} kernels", f"kind {kind}")
    return dict(share_compute=c.share_compute, fixed_ms=c.fixed_ms, rows=c.rows, mape=c.mape,
                gpu=gpu.name, architecture=gpu.architecture)


def attention_cube(heads: int, tokens: int, dim: int) -> tuple:
    """One GEMM cube of a causal SDPA kernel's forward and backward (seven GEMMs over half the
    keys, `heads` of `tokens` queries of `dim`), as the sweep's kernels are fitted."""
    return cube(7 * heads * tokens * max(tokens // 2, 1) * dim)


def one_gpu(names: set[str], what: str, kinds: str) -> str:
    """The one GPU a sweep's measured `what` (of `kinds`) ran on, from their GPUs' `names`; a
    ValueError where there are none or several."""
    if not names:
        raise ValueError(f"no measured {what} ({kinds}) in the sweep")
    if len(names) > 1:
        raise ValueError(f"{what} of several GPUs: {sorted(names)}")
    return next(iter(names))


def _fit_one_gpu(items: list[tuple], what: str, kinds: str) -> tuple[Constants, GPU]:
    """The constants fitted on a sweep's `items` (op, dims, the GPU as seen, ms) of `what`,
    all of one GPU, and that GPU (as seen)."""
    one_gpu({s.name for _, _, s, _ in items}, what, kinds)
    ops, dims, seen, ms = (list(x) for x in zip(*items))
    return _fit(ops, dims, seen, ms), seen[0]


# a step's precision -> the arithmetic its linear layers' GEMMs run at, and the elements of
# it that fill the 16 bytes of one vector load
GEMM_ARITHMETIC = {"fp32": ("fp32", 4), "tf32": ("tf32", 4), "amp-fp16": ("fp16", 8),
                   "amp-bf16": ("bf16", 8)}


def fit_unaligned(rows: Sequence[dict], kind: str = "linear-train") -> dict:
    """A lent GPU's measured unaligned GEMMs against their aligned twins (a kernel sweep's
    `kind` rows, `measure.kernel_sweep.aligned_twin`: `linear-train`, language-model heads at
    vocabularies not a multiple of 64; `bmm-unaligned`, attention's batched GEMMs at token
    counts not a multiple of 8): per arithmetic, the median over the pairs of the time per
    FLOP unaligned over aligned (`ratio`), the pairs (`pairs`), the GPU and its architecture."""
    from mdot_jax.measure.kernel_sweep import aligned_twin

    timed = {(r["device"], r["precision"], tuple(r["dims"])): r for r in rows
             if r.get("kind") == kind and r.get("ms")}
    ratios: dict[str, list[float]] = {}
    devices = set()
    for (device, precision, dims), r in timed.items():
        other = timed.get((device, precision, aligned_twin(kind, dims)))
        if other:
            devices.add(device)
            ratios.setdefault(precision, []).append(
                (r["ms"] / r["flops"]) / (other["ms"] / other["flops"]))
    what = "unaligned heads" if kind == "linear-train" else "unaligned batched GEMMs"
    gpu = catalog.find(one_gpu(devices, f"{what} with their aligned twins", f"kind {kind}"))
    return dict(ratio={p: float(np.median(x)) for p, x in sorted(ratios.items())},
                pairs={p: len(x) for p, x in sorted(ratios.items())}, gpu=gpu.name,
                architecture=gpu.architecture)


def unaligned(precision: str, dims: Sequence[int]) -> list[int]:
    """A linear layer's in and out features (`dims` (b, m, n, k): n and k, the rows' lengths
    of its matrices) that are not a multiple of what one vector load holds at the arithmetic
    `precision` runs its GEMMs at (none: aligned)."""
    elements = GEMM_ARITHMETIC.get(precision, (None, 0))[1]
    return [int(d) for d in dims[2:4] if elements and d % elements]


def unaligned_slowdown(fitted: dict | None, gpu: GPU, precision: str, dims: Sequence[int]
                       ) -> float:
    """How many times slower than priced a linear layer's GEMMs run (forward and both
    gradients) when its features are `unaligned`: `fitted`'s measured ratio
    (`fit_unaligned`) on GPUs of its architecture; else 1."""
    arithmetic = GEMM_ARITHMETIC.get(precision, (None, 0))[0]
    if not (fitted and arithmetic in fitted["ratio"] and gpu.architecture ==
            fitted["architecture"]) or not unaligned(precision, dims):
        return 1.0
    return max(fitted["ratio"][arithmetic], 1.0)


def fused_attention_share(fitted: dict | None, gpu: GPU, tc, kernel: str = "flash"
                          ) -> tuple[float, str]:
    """How much slower than tensor-core GEMMs of its FLOPs SDPA's `kernel` (`flash`, or
    `efficient`: the memory-efficient one, which takes a mask tensor) runs on `gpu` (the GEMMs'
    share of the peak over `fitted`'s, a step model's `fused_attention` (`fit_attention`),
    where `gpu` is of its architecture; else 1), and what backs it. `tc`: the step's (peak,
    TensorCoreGemms, note), or None. A model without the efficient kernel's fit prices it as
    flash."""
    if not (fitted and tc and gpu.architecture == fitted["architecture"]):
        return 1.0, "at the GEMMs' share of the peak, not measured"
    where = "" if gpu.name == fitted["gpu"] else " (not measured on this GPU)"
    own = fitted.get(kernel, fitted)  # the flash kernels' fit holds the efficient ones'
    what = "flash" if own is fitted else "memory-efficient (causal, unmasked)"
    return (tc[1].constants[ARITHMETIC[tc[0]]].share_compute / own["share_compute"],
            f"at the {own['share_compute']:.0%} of the peak the {fitted['gpu']}'s measured "
            f"SDPA {what} kernels reach{where}")


def fit_attention(rows: Sequence[dict]) -> dict:
    """A step model's `fused_attention` from a kernel sweep's rows: the flash kernels' fit
    (`fit_fused_attention`), with the memory-efficient kernels' under `efficient` where the
    sweep measured them."""
    fitted = fit_fused_attention(rows)
    if any(r.get("kind") == "sdpa-efficient" and r.get("ms") for r in rows):
        e = fit_fused_attention(rows, "sdpa-efficient")
        fitted["efficient"] = {k: e[k] for k in ("share_compute", "fixed_ms", "rows", "mape")}
    return fitted


def _fit(ops, dims, seen, ms) -> Constants:
    """`fit_sums` of kernels measured one by one."""
    return fit_sums([([(o, d)], g, t) for o, d, g, t in zip(ops, dims, seen, ms)])


def fit_sums(rows: Sequence[tuple[Sequence[tuple[str, Sequence[int]]], GPU, float]]
             ) -> Constants:
    """The three constants, least squares of log(priced / measured) over `rows` of (kernels
    (op, dims), the GPU as they see it, ms measured), a row priced as the sum of its kernels'
    times; each constant kept in its range by its parametrisation (shares by a sigmoid, the
    fixed cost by exp)."""
    from scipy.optimize import least_squares

    owner, compute, memory = [], [], []
    for i, (kernels, g, _) in enumerate(rows):
        for o, d in kernels:
            flops, moved, *_ = work(o, d)
            owner.append(i)
            compute.append(1e3 * flops / (g.tflops["fp32"] * 1e12))
            memory.append(1e3 * moved / (g.memory_gbs * 1e9))
    at, c, m = np.asarray(owner), np.asarray(compute), np.asarray(memory)
    y = np.log(np.asarray([t for *_, t in rows], np.float64))

    def unpack(p):
        return 1 / (1 + math.exp(-p[0])), 1 / (1 + math.exp(-p[1])), math.exp(p[2])

    def priced(p):
        sc, sm, fixed = unpack(p)
        return np.bincount(at, fixed + np.maximum(c / sc, m / sm), minlength=len(y))

    p = least_squares(lambda p: np.log(priced(p)) - y, [1.0, 1.0, math.log(5e-3)]).x
    sc, sm, fixed = unpack(p)
    return Constants(sc, sm, fixed, len(y),
                     float(100 * np.mean(np.abs(priced(p) / np.exp(y) - 1))))
