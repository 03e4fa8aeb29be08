"""A GPU operator model: the forward time of an operator on any NVIDIA GPU from its shapes and
the GPU's spec sheet (`data.gpus`), fitted across the GPUs that have measurements.

What transfers between GPUs is learned, not looked up: every feature is relative to the
device (time at the compute and the memory roofline, arithmetic intensity over the GPU's
ridge point, waves of tiles over its SMs, working set over its L2), and the target is the
log ratio of the measured time to the roofline time, max(FLOPs / peak, bytes / bandwidth).
A GPU nobody measured is priced from its spec sheet alone.

Operators (fp32, as measured): GEMMs (`bmm` [B,M,K] x [B,K,N]; `linear` [B,M,K] x [K,N]),
convolutions as implicit GEMMs (`conv`, `neusight.conv_dims`), elementwise (binary, with a
scalar: `...u`, activations) and row-wise (`softmax`, `ln`) over [B, H]. Dims: GEMMs
(B, M, N, K), convolutions (G, M, N, K, X), the others (B, H).

Whole steps (`StepPricer`): the nodes of a traced model priced one by one and composed, the
backward of a GEMM as its two GEMMs.
"""

from __future__ import annotations

import json
import lzma
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mdot_jax.gpu import streaming
from mdot_jax.gpu.catalog import GPU
from mdot_jax.gpu.neusight import CONV, GEMMS, OPS, ROWWISE
from mdot_jax.gpu.work import roofline_ms, waves, work
from mdot_jax.models.trees import PREDICTING, fit_boosters, parse_boosters
from mdot_jax.serving.prediction import Adaptation

if TYPE_CHECKING:  # a Flax model, imported where a step model holds one
    from mdot_jax.gpu.kernel_model import KernelModel

VERSION = 2
GRID = ((63, 0.05),)
KNOWN_ROWS = 1 << 16  # predictions a model keeps, by feature row
# device features as such (not relative to the device): only in the `absolute` feature set
ABSOLUTE = ("log_peak", "log_bandwidth", "log_sms", "log_l2", "clock_ghz")
RELATIVE = ("log_roofline_ms", "log_compute_ms", "log_memory_ms", "log_intensity_over_ridge",
            "log_waves", "wave_efficiency", "tile_efficiency", "log_bytes_over_l2", "log_k")


def features(ops: Sequence[str], dims: Sequence[Sequence[int]], gpus: Sequence[GPU],
             absolute: bool = False) -> np.ndarray:
    """`[N, F]` float32: the op id (categorical), the relative features `RELATIVE` and, with
    `absolute`, the device's own (`ABSOLUTE`)."""
    out = []
    for op, d, g in zip(ops, dims, gpus):
        flops, moved, units, used, k = work(op, d)
        peak, bw = g.tflops["fp32"] * 1e12, g.memory_gbs * 1e9
        compute, memory = 1e3 * flops / peak, 1e3 * moved / bw
        w = waves(op, units, g)
        row = [OPS.index(op), math.log10(max(compute, memory)), math.log10(compute),
               math.log10(memory), math.log10(flops / moved / (peak / bw)),
               math.log10(w), w / math.ceil(w), used,
               math.log10(moved / (g.l2_mb * 2 ** 20)), math.log10(k)]
        if absolute:
            row += [math.log10(peak), math.log10(bw), math.log10(g.sms), math.log10(g.l2_mb),
                    g.boost_mhz / 1e3]
        out.append(row)
    return np.asarray(out, np.float32)


@dataclass
class GpuOpModel:
    """LightGBM of log(measured / roofline) over device-relative features."""

    text: str
    gpus: tuple[str, ...]  # the GPUs it was fitted on
    samples: int
    absolute: bool = False
    version: int = VERSION
    _boosters: list = field(default=None, repr=False, compare=False)
    _known: dict = field(default_factory=dict, repr=False, compare=False)  # row bytes -> log
    _packed: bytes | None = field(default=None, init=False, repr=False, compare=False)  # as read

    @classmethod
    def fit(cls, ops: Sequence[str], dims: Sequence[Sequence[int]], gpus: Sequence[GPU],
            ms: Sequence[float], *, absolute: bool = False, seed: int = 0,
            val_fraction: float = 0.1) -> GpuOpModel:
        """Fitted on measured rows, early-stopped on a seeded random carve-out of them."""
        x = features(ops, dims, gpus, absolute)
        y = np.log(np.asarray(ms, np.float64)) - np.log(10.0) * x[:, 1].astype(np.float64)
        val = np.random.default_rng(seed).random(len(y)) < val_fraction
        boosters = fit_boosters(x[~val], y[~val], x[val], y[val], seed=seed, grid=GRID,
                                seeds=1, categorical=[0], min_data_in_leaf=20)
        return cls(boosters[0].model_to_string(), tuple(sorted({g.name for g in gpus})),
                   len(y), absolute, _boosters=boosters)

    def predict(self, ops: Sequence[str], dims: Sequence[Sequence[int]],
                gpus: Sequence[GPU]) -> np.ndarray:
        """`[N]` predicted forward ms."""
        if self._boosters is None:
            self._boosters = parse_boosters(self.text)
        x = features(ops, dims, gpus, self.absolute)
        if not len(x):
            return np.zeros(0)
        rows, back = np.unique(x, axis=0, return_inverse=True)  # a model repeats its layers
        keys = [r.tobytes() for r in rows]
        with PREDICTING:  # rows priced before (another layout, precision or GPU) are not again
            new = [j for j, k in enumerate(keys) if k not in self._known]
            if new and len(self._known) + len(new) > KNOWN_ROWS:  # full: keep these rows alone
                self._known.clear()
                new = list(range(len(keys)))
            if new:
                for j, v in zip(new, self._boosters[0].predict(rows[new])):
                    self._known[keys[j]] = float(v)
            log_ms = np.array([self._known[k] for k in keys])
        ms = np.exp(log_ms + np.log(10.0) * rows[:, 1].astype(np.float64))
        return ms[back.reshape(-1)]

    def save(self, path: str | Path) -> None:
        """xz-compressed JSON, the booster's text `compact`; a model read from a file (a
        checkpoint adapted from it) writes the bytes it was read from (compressing takes
        seconds)."""
        Path(path).write_bytes(self._packed or lzma.compress(json.dumps(dict(
            text=compact(self.text), gpus=list(self.gpus), samples=self.samples,
            absolute=self.absolute, version=self.version)).encode(),
            preset=9 | lzma.PRESET_EXTREME))

    @classmethod
    def load(cls, path: str | Path) -> GpuOpModel:
        packed = Path(path).read_bytes()
        d = json.loads(lzma.decompress(packed))
        if d.get("version") != VERSION:
            raise ValueError(f"{path}: GPU operator model version {d.get('version')} != "
                             f"{VERSION}")
        model = cls(d["text"], tuple(d["gpus"]), d["samples"], d["absolute"], d["version"])
        model._packed = packed
        return model


# what a LightGBM model's text holds only for inspection (and the byte sizes of its trees,
# which any edit invalidates)
_INSPECTION = ("split_gain=", "internal_value=", "internal_weight=", "internal_count=",
               "leaf_weight=", "leaf_count=", "tree_sizes=")


def compact(text: str) -> str:
    """A LightGBM model's text without what prediction never reads, leaf values to 9
    significant digits: less than half the size, predictions equal to ~1e-8."""
    lines = []
    for line in text.split("\n"):
        if line.startswith("leaf_value="):
            line = "leaf_value=" + " ".join(f"{float(v):.9g}" for v in line[11:].split())
        if not line.startswith(_INSPECTION):
            lines.append(line)
    return "\n".join(lines)


@dataclass(frozen=True)
class BinnedRoofline:
    """Per op class, the roofline times a correction that depends on the roofline time alone:
    the median log ratio measured / roofline in quantile bins of log roofline time,
    interpolated between bins and held flat beyond the fitted range (a GPU faster than any
    fitted is corrected as the fastest operators fitted were)."""

    params: dict  # class -> ([bins] log10 roofline ms, [bins] log ratio)

    @classmethod
    def fit(cls, ops, dims, gpus, ms, bins: int = 32) -> BinnedRoofline:
        classes = np.asarray([CalibratedRoofline.op_class(o) for o in ops])
        roof = np.asarray([roofline_ms(o, d, g) for o, d, g in zip(ops, dims, gpus)])
        x, y = np.log10(roof), np.log(np.asarray(ms, np.float64) / roof)
        params = {}
        for c in sorted(set(classes)):
            m = classes == c
            edges = np.quantile(x[m], np.linspace(0, 1, bins + 1))
            at = [(x[m] >= a) & (x[m] <= b) for a, b in zip(edges[:-1], edges[1:])]
            params[c] = ([float(np.median(x[m][s])) for s in at if s.any()],
                         [float(np.median(y[m][s])) for s in at if s.any()])
        return cls(params)

    def predict(self, ops, dims, gpus) -> np.ndarray:
        out = []
        for o, d, g in zip(ops, dims, gpus):
            roof = roofline_ms(o, d, g)
            cx, cy = self.params[CalibratedRoofline.op_class(o)]
            out.append(roof * math.exp(float(np.interp(math.log10(roof), cx, cy))))
        return np.asarray(out)


@dataclass(frozen=True)
class CalibratedRoofline:
    """The baseline: per op class, ms = roofline / efficiency + overhead, both fitted (least
    squares of the relative error) on the same rows as the model."""

    params: dict  # class -> (1 / efficiency, overhead ms)

    @staticmethod
    def op_class(op: str) -> str:
        return ("gemm" if op in GEMMS else CONV if op == CONV else "rowwise" if op in ROWWISE
                else "elementwise")

    @classmethod
    def fit(cls, ops, dims, gpus, ms) -> CalibratedRoofline:
        params = {}
        classes = np.asarray([cls.op_class(o) for o in ops])
        roof = np.asarray([roofline_ms(o, d, g) for o, d, g in zip(ops, dims, gpus)])
        y = np.asarray(ms, np.float64)
        for c in sorted(set(classes)):
            m = classes == c
            a = np.stack([roof[m] / y[m], 1 / y[m]], axis=1)  # relative least squares
            params[c] = tuple(float(v) for v in np.linalg.lstsq(a, np.ones(m.sum()),
                                                                 rcond=None)[0])
        return cls(params)

    def predict(self, ops, dims, gpus) -> np.ndarray:
        return np.asarray([self.params[self.op_class(o)][0] * roofline_ms(o, d, g)
                           + self.params[self.op_class(o)][1]
                           for o, d, g in zip(ops, dims, gpus)])


# ---------------------------------------------------------------------------- whole models
def backward_gemms(op: str, dims: Sequence[int]) -> list[tuple[str, tuple[int, ...]]]:
    """The two GEMMs of a GEMM's backward pass: the data gradient (the output's gradient
    times the weight, contracting N) and the weight gradient (contracting the rows)."""
    b, m, n, k = (int(d) for d in dims)
    if op == "linear":
        return [("linear", (b, m, k, n)), ("linear", (1, k, n, b * m))]
    return [("bmm", (b, m, k, n)), ("bmm", (b, k, n, m))]


@dataclass(frozen=True)
class StepPricer:
    """Prices a traced model's step on a GPU from its nodes: each node's forward by an
    operator pricer (`pricer(ops, dims, gpus) -> [N] ms`); a GEMM's backward as its two
    GEMMs, any other node's as `ratios[kind]` times its forward (measured on the training
    GPUs); the gradient accumulation of weights as an elementwise add over them. Views and
    metadata (`free`) cost nothing."""

    pricer: Callable[..., np.ndarray]
    ratios: dict  # kind -> measured backward / forward

    @staticmethod
    def fit_ratios(labels) -> dict:
        """Per node kind, the median of measured backward / forward times over the nodes of
        `labels` (training runs of the training GPUs) that have both."""
        by: dict[str, list[float]] = {}
        for label in labels:
            for n in label.nodes:
                if n.kind != "free" and n.kind not in GEMMS and n.fw_ms > 0 and n.bw_ms > 0:
                    by.setdefault(n.kind, []).append(n.bw_ms / n.fw_ms)
        return {k: float(np.median(v)) for k, v in sorted(by.items())}

    def node_ms(self, label, gpu: GPU) -> dict[str, np.ndarray]:
        """`fw`, `bw`, `acc`: `[N]` predicted ms of each node of `label` on `gpu`."""
        nodes = label.nodes
        free = ("free", "dropout") if label.mode == "inf" else ("free",)
        priced = [i for i, n in enumerate(nodes) if n.kind not in free]
        fw = np.zeros(len(nodes))
        fw[priced] = self.pricer([nodes[i].op for i in priced], [nodes[i].dims for i in priced],
                                 [gpu] * len(priced))
        bw, acc = np.zeros(len(nodes)), np.zeros(len(nodes))
        if label.mode == "train":
            gemms = [(i, o, d) for i in priced if nodes[i].kind in GEMMS
                     for o, d in backward_gemms(nodes[i].op, nodes[i].dims)]
            if gemms:
                ms = self.pricer([g[1] for g in gemms], [g[2] for g in gemms], [gpu] * len(gemms))
                np.add.at(bw, [g[0] for g in gemms], ms)
            for i in priced:
                if nodes[i].kind not in GEMMS:
                    bw[i] = self.ratios.get(nodes[i].kind, 1.0) * fw[i]
            weights = [i for i in priced if nodes[i].params > 0]
            if weights:
                acc[weights] = self.pricer(["add"] * len(weights),
                                           [(1, nodes[i].params) for i in weights],
                                           [gpu] * len(weights))
        return dict(fw=fw, bw=bw, acc=acc)

    def predict(self, label, gpu: GPU) -> dict[str, float]:
        """`fw`, `bwall` (backward and accumulation) and `e2e` ms of the labelled run."""
        ms = self.node_ms(label, gpu)
        fw, bwall = label.compose(ms["fw"]), label.compose(ms["bw"] + ms["acc"])
        return dict(fw=fw, bwall=bwall, e2e=fw + bwall)


SPLIT_DEPTH = 4  # a fitted step model's `split_gemms` (adopted by bench_split_gemms.py's rule)


def split_gemms(price, ops: list, dims: list, seen: list, depth: int) -> np.ndarray:
    """`[N]` ms of each kernel by `price(ops, dims, seen)`, a GEMM's (linear, bmm: dims B, M,
    N, K) no more than 2^j times its 1 / 2^j piece's (j = 1..`depth`; each halving takes the
    larger of M and N): a GEMM can always run as two of half its output."""
    ms = np.asarray(price(ops, dims, seen), np.float64)
    at = [j for j, o in enumerate(ops) if o in GEMMS]
    if not at:
        return ms
    pieces = [list(dims[j]) for j in at]
    for level in range(1, depth + 1):
        for d in pieces:
            side = 1 if d[1] >= d[2] else 2
            d[side] = -(-d[side] // 2)
        t = price([ops[j] for j in at], [tuple(d) for d in pieces], [seen[j] for j in at])
        ms[at] = np.minimum(ms[at], (2 ** level) * np.asarray(t, np.float64))
    return ms


@dataclass
class StepModel:
    """What prices a training step on a GPU from its spec sheet (`gpu.spec_sheet`): the
    operator pricer (the kernel model, `gpu.kernel_model`, or the LightGBM operator model),
    the backward / forward ratios of non-GEMM node kinds, and the 80% band of the log ratio
    measured / predicted of whole steps on GPUs left out of the fit."""

    ops: GpuOpModel | KernelModel  # `predict(ops, dims, gpus) -> [N] ms`
    ratios: dict  # node kind -> backward / forward
    band: tuple[float, float]  # 10th, 90th percentile of log(measured / predicted)
    info: dict  # fitted_gpus, band_labels, source, command

    MODEL, META = "gpu_ops.json.xz", "step_model.json"

    def host_ms(self, framework: str) -> float:
        """The host's time to issue a kernel (ms) under `framework` (`host_ms_per_kernel`: one
        number for every framework, or one per framework); 0 where none was fitted."""
        h = self.info.get("host_ms_per_kernel", 0.0)
        return float(h.get(framework, 0.0) if isinstance(h, dict) else h)

    def host_range(self, framework: str) -> tuple[float, float] | None:
        """The least and the most ms a kernel the machines measured under `framework` issue
        kernels at, each machine fitted alone (`host_range_ms_per_kernel`), where known."""
        r = self.info.get("host_range_ms_per_kernel", {}).get(framework)
        return (float(r[0]), float(r[1])) if r else None

    def adaptation(self, gpu: GPU, warnings: list[str]) -> Adaptation | None:
        """The adaptation this model holds to measured steps of `gpu`, if any (one of another
        GPU is said in `warnings`)."""
        adapted = self.info.get("adaptation")
        if adapted and self.info["gpu"]["name"] != gpu.name:
            warnings.append(f"this step model was adapted to the {self.info['gpu']['name']}; "
                            f"the {gpu.name} is priced unadapted")
            return None
        return Adaptation.from_json(adapted) if adapted else None

    def banded(self, adapted: Adaptation | None, precision: str, total: float, banded: bool,
               warnings: list[str]) -> tuple[float, tuple[float, float] | None, str]:
        """(the factor an adaptation of the affine forms puts on `total` ms, else 1; the band
        of the step's time, or None; what the band was measured on). Says in `warnings` where
        an adaptation's rows were of another precision."""
        if adapted is None:
            lo, hi = self.band
            return 1.0, (total * math.exp(lo), total * math.exp(hi)) if banded else None, \
                "whole steps on GPUs the predictor had not seen"
        scale = 1.0 if adapted.fit == "machine" else \
            float(adapted.apply(np.asarray([total]))[0]) / total
        if precision != self.info.get("precision"):
            warnings.append(f"adapted to steps measured at {self.info.get('precision')}, "
                            f"not {precision}: no band")
            return scale, None, ""
        return scale, adapted.interval(total * scale), (
            f"the {adapted.n_rows} steps measured on the {adapted.device} it was adapted to, "
            "each priced by a fit on the others")

    def kernel_ms(self, ops: list, dims: list, seen: list, streamed: bool) -> np.ndarray:
        """`[N]` ms of each kernel: as measured alone (a pricer's fixed cost per kernel is the
        host's and the launch's), or, `streamed` behind a host that issues them, the GPU's part
        alone (the pricer's `parts` without its `launch_ms`; a pricer without parts: all of
        it). Memory-bound kernels at a measured share of the bandwidth where the model holds
        `streaming_kernels` (`gpu.streaming`)."""
        if not ops:
            return np.zeros(0)
        rows: dict = {}  # a deep model's layers repeat their kernels: each priced once
        which = np.array([rows.setdefault((o, tuple(d), id(g)), len(rows))
                          for o, d, g in zip(ops, dims, seen)])
        if len(rows) < len(ops):
            first = np.unique(which, return_index=True)[1]
            return self.kernel_ms([ops[j] for j in first], [dims[j] for j in first],
                                  [seen[j] for j in first], streamed)[which]
        if not (streamed and hasattr(self.ops, "parts")):
            price = self.ops.predict
        else:
            def price(o, d, s):
                parts = self.ops.parts(o, d, s)
                return parts["ms"] - parts["launch_ms"]
        ms = split_gemms(price, ops, dims, seen, self.info.get("split_gemms", 0))
        if "streaming_kernels" in self.info:
            bound = streaming.ms(self.info["streaming_kernels"]["constants"], ops, dims, seen,
                                 streamed)
            ms = np.where(np.isnan(bound), ms, bound)
        return ms

    def save(self, folder: str | Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        if isinstance(self.ops, GpuOpModel):
            self.ops.save(folder / self.MODEL)
        else:
            self.ops.save(folder)
        (folder / self.META).write_text(json.dumps(dict(
            ratios=self.ratios, band=list(self.band), **self.info), indent=1) + "\n")

    @classmethod
    def load(cls, folder: str | Path) -> StepModel:
        folder = Path(folder)
        meta = json.loads((folder / cls.META).read_text())
        ratios, band = meta.pop("ratios"), tuple(meta.pop("band"))
        if meta.get("pricer") == "kernel":  # a Flax kernel model (`gpu-fit --pricer kernel`)
            from mdot_jax.gpu.kernel_model import KernelModel

            ops: GpuOpModel | KernelModel = KernelModel.load(folder)
        else:
            ops = GpuOpModel.load(folder / cls.MODEL)
        return cls(ops, ratios, band, meta)
