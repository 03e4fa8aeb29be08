"""A CNN's kernels at the shares a lent GPU's kernel sweep measured (pre-registered:
docs/studies/cnn-kernels.md; active only where a step model holds `cnn_kernels`).

The shipped model prices a convolution under autocast with the operator model fitted on fp32
CUDA-core convolutions, the tensor-core peak as the GPU's, and batch norm as a row-wise kernel
measured on layer norms. The kit's sweep (`measure.kernel_sweep`) times the real kernels: dense
(`conv-train`) and depthwise (`dwconv-train`) convolutions with both gradients, and batch norm
forward (`batch_norm`) and with its backward (`batch_norm-train`), at fp32 (cuDNN's TF32) and
bf16, NCHW (the layout a GPU priced from its spec sheet trains in). Each kernel takes

    t = fixed + max(FLOPs / (share_c peak), bytes / (share_m bandwidth))

(`tensor_cores.Constants`), its FLOPs and bytes counted by `gpu.work` on the dims
`classify.classify` gives it, the GPU seen at the arithmetic's peak and element width. The
constants of a convolution are fitted so that its three kernels (`conv_kernels`: the forward,
the data gradient, the weight gradient) sum to the measured `-train` time; batch norm's forward
on the forward rows, its backward on each shape's train time less its forward (where that is
not lost in the two times' noise: `BN_BACKWARD_LEAST`).

Channels-last (`fit_layout`, a step model's `channels_last`; docs/studies/channels-last.md): a
step in NHWC is priced as in NCHW, each convolution's and batch norm's forward kernel times the
sweep's forward ratio (the sum of its NHWC forward times over the sum of its NCHW ones, so that
the large kernels a step is made of weigh most), its backward kernels times the backward ratio
(the same of the `-train` times less the forward ones), per kind and arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from mdot_jax.gpu import catalog, peaks
from mdot_jax.gpu.catalog import GPU
from mdot_jax.gpu.tensor_cores import Constants, fit_sums, one_gpu
from mdot_jax.options import LAYOUTS

# a step's precision -> the sweep's rows that price its convolutions and batch norms
SWEPT = {"fp32": "fp32", "tf32": "fp32", "amp-fp16": "bf16", "amp-bf16": "bf16",
         "bf16": "bf16", "fp8": "bf16"}
WIDTH = {"fp32": 4, "bf16": 2}
LAYOUT = "nchw"
LAYOUT_KINDS = {"dense": ("conv", "conv-train"), "depthwise": ("dwconv", "dwconv-train"),
                "batch norm": ("batch_norm", "batch_norm-train")}  # the sweep's kinds of each
MIN_ROWS = 4  # measured kernels a set of constants needs (three are fitted)
BN_OP = "ln"  # the measured operator `classify.classify` gives a batch norm
BN_BACKWARD_LEAST = 0.25  # of a batch norm's train time, the least its backward can be (it
# reads x and dy and writes dx, the forward reads x twice and writes y)


def conv_kernels(dims: Sequence[int], groups: int, in_channels: int, kernel: int,
                 out_numel: int, data_gradient: bool) -> list[tuple[str, tuple]]:
    """The kernels (op, dims) of a convolution `classify.classify` gave `dims` (1, M, G N,
    K, X): its forward, its input's gradient (a convolution of the output's gradient; none
    where its input is the graph's) and its weight's (G batched GEMMs)."""
    _, m, n, k, x = (int(d) for d in dims)
    out = [("conv", (1, m, n, k, x))]
    if data_gradient:
        out.append(("conv", (1, x // in_channels, in_channels, n // groups * kernel, out_numel)))
    return out + [("bmm", (groups, n // groups, k, m))]


def is_depthwise(groups: int, in_channels: int, out_channels: int) -> bool:
    """One filter per channel: groups = in = out channels (MobileNet's, EfficientNet's)."""
    return groups > 1 and groups == in_channels == out_channels


def swept_conv(row: dict) -> tuple[str, list[tuple[str, tuple]]]:
    """(dense or depthwise, its kernels) of a sweep's convolution row, as a step prices it."""
    from mdot_jax.measure.kernel_sweep import conv_shape

    n, c, h, k, r, stride, groups = conv_shape(row)
    side = -(-h // stride)  # padding r // 2
    m, x = n * side * side, n * c * h * h
    dims = (1, m, k, c // groups * r * r, x)
    kind = "depthwise" if is_depthwise(groups, c, k) else "dense"
    return kind, conv_kernels(dims, groups, c, r * r, n * k * side * side, True)


def seen(gpu: GPU, swept: str, conv: bool) -> GPU:
    """`gpu` as a sweep's `swept` kernel sees it: a convolution at its peak for that arithmetic
    (TF32 for fp32, as cuDNN runs it), batch norm at the fp32 peak; the element's width."""
    precision = "fp32" if swept == "fp32" else "amp-bf16"
    peak = peaks.conv_peak(gpu, precision) if conv else gpu.tflops["fp32"]
    return catalog.as_seen(gpu, peak, WIDTH[swept])


def fit(rows: Sequence[dict]) -> dict:
    """The constants of a sweep's NCHW convolutions and batch norms, keyed `dense/fp32`,
    `depthwise/bf16`, `bn-forward/fp32`, `bn-backward/bf16`, ... (those with at least
    `MIN_ROWS` measured kernels), with the GPU and its architecture, as a step model's
    `cnn_kernels` holds them."""
    rows = [r for r in rows if r.get("ms") and r.get("layout") == LAYOUT
            and r.get("precision") in WIDTH]
    gpu = catalog.find(one_gpu(
        {r["device"] for r in rows if r["kind"].endswith(("conv-train", "batch_norm"))},
        "NCHW convolutions or batch norms",
        "kinds conv-train, dwconv-train, batch_norm, batch_norm-train"))
    sets: dict[str, list] = {}
    forward = {(r["precision"], tuple(r["dims"])): r["ms"] for r in rows
               if r["kind"] == "batch_norm"}
    for r in rows:
        p, kind = r["precision"], r["kind"]
        if kind in ("conv-train", "dwconv-train"):
            name, kernels = swept_conv(r)
            sets.setdefault(f"{name}/{p}", []).append((kernels, seen(gpu, p, True), r["ms"]))
        elif kind.startswith("batch_norm"):
            n, c, h = r["dims"]
            ms = r["ms"] if kind == "batch_norm" else \
                r["ms"] - forward.get((p, tuple(r["dims"])), math.inf)
            phase = "forward" if kind == "batch_norm" else "backward"
            if ms >= BN_BACKWARD_LEAST * r["ms"]:  # less: the two times' noise, not a kernel
                sets.setdefault(f"bn-{phase}/{p}", []).append(
                    ([(BN_OP, (n * c, h * h))], seen(gpu, p, False), ms))
    constants = {k: vars(fit_sums(v)) for k, v in sorted(sets.items()) if len(v) >= MIN_ROWS}
    if not constants:
        raise ValueError(f"fewer than {MIN_ROWS} measured kernels of each kind in the sweep")
    return dict(constants=constants, gpu=gpu.name, architecture=gpu.architecture)


@dataclass(frozen=True)
class CnnKernels:
    """A step's convolutions and batch norms at the measured constants (`applying`)."""

    constants: dict[str, Constants]
    swept: str  # the sweep's precision that prices this step's
    gpu: GPU
    note: str

    def conv_ms(self, depthwise: bool, kernels: Sequence[tuple[str, tuple]]
                ) -> list[float] | None:
        """ms of each of a convolution's kernels (`conv_kernels`), or None where its kind was
        not measured."""
        c = self.constants.get(f"{'depthwise' if depthwise else 'dense'}/{self.swept}")
        at = seen(self.gpu, self.swept, True)
        return None if c is None else [c.ms(o, d, at) for o, d in kernels]

    def bn_ms(self, dims: Sequence[int]) -> tuple[float, float] | None:
        """ms of a batch norm's forward and backward kernels (dims: its rows, row length), or
        None where either was not measured."""
        c = [self.constants.get(f"bn-{phase}/{self.swept}") for phase in ("forward", "backward")]
        at = seen(self.gpu, self.swept, False)
        return None if None in c else (c[0].ms(BN_OP, dims, at), c[1].ms(BN_OP, dims, at))


def applying(info: dict, gpu: GPU, precision: str) -> CnnKernels | None:
    """The measured constants (a step model's `cnn_kernels`) for a step at `precision` on
    `gpu`, where it is of the architecture they were measured on; else None."""
    fitted, swept = info.get("cnn_kernels"), SWEPT.get(precision)
    if not (fitted and swept and gpu.architecture == fitted["architecture"]):
        return None
    constants = {k: Constants(**v) for k, v in fitted["constants"].items()}
    where = "" if gpu.name == fitted["gpu"] else " (not measured on this GPU)"
    return CnnKernels(constants, swept, gpu,
                      f"convolutions and batch norms priced at the shares the "
                      f"{fitted['gpu']}'s measured {swept} NCHW kernels reach{where}")


def fit_layout(rows: Sequence[dict]) -> dict:
    """The channels-last ratios (module docstring) of a sweep's convolutions and batch norms
    measured in both layouts, keyed `dense/bf16`, `depthwise/fp32`, `batch norm/bf16`, ...
    (those with at least `MIN_ROWS` shapes), with the GPU, as a step model's `channels_last`
    holds them."""
    kinds = {k for pair in LAYOUT_KINDS.values() for k in pair}
    rows = [r for r in rows if r.get("ms") and r["kind"] in kinds and r.get("precision") in WIDTH
            and r.get("layout") in LAYOUTS]
    gpu = catalog.find(one_gpu({r["device"] for r in rows}, "convolutions or batch norms",
                               "kinds conv, dwconv, batch_norm and their -train rows"))
    ms = {(r["kind"], r["precision"], tuple(r["dims"]), r["layout"]): r["ms"] for r in rows}
    ratios = {}
    for name, (fw, train) in LAYOUT_KINDS.items():
        for p in WIDTH:
            shapes = [d for k, q, d, lay in ms if (k, q, lay) == (train, p, "nchw")
                      and all((x, p, d, y) in ms for x in (fw, train) for y in LAYOUTS)]
            if len(shapes) < MIN_ROWS:
                continue
            fwd, whole = ({y: sum(ms[k, p, d, y] for d in shapes) for y in LAYOUTS}
                          for k in (fw, train))
            back = {y: whole[y] - fwd[y] for y in whole}
            if min(back.values()) <= 0:
                raise ValueError(f"{train} at {p}: the train times sum to no more than the "
                                 "forward ones; no backward to compare")
            ratios[f"{name}/{p}"] = dict(forward=fwd["nhwc"] / fwd["nchw"],
                                         backward=back["nhwc"] / back["nchw"], shapes=len(shapes))
    if not ratios:
        raise ValueError(f"fewer than {MIN_ROWS} shapes of each kind measured in both layouts")
    return dict(ratios=ratios, gpu=gpu.name)


@dataclass(frozen=True)
class ChannelsLast:
    """A channels-last step's layout ratios (`channels_last`)."""

    ratios: dict[str, tuple[float, float]]  # kind -> (forward, backward)
    note: str

    def of(self, kind: str) -> tuple[float, float]:
        """(forward, backward) ratios of a kind (`LAYOUT_KINDS`); 1 where not measured."""
        return self.ratios.get(kind, (1.0, 1.0))


def channels_last(info: dict, gpu: GPU, precision: str) -> ChannelsLast | None:
    """The layout ratios (a step model's `channels_last`) for a channels-last step at
    `precision` on `gpu`, or None where the step model has none."""
    fitted, swept = info.get("channels_last"), SWEPT.get(precision, "fp32")
    if not fitted:
        return None
    ratios = {k.split("/")[0]: (v["forward"], v["backward"])
              for k, v in fitted["ratios"].items() if k.endswith(f"/{swept}")}
    said = ", ".join(f"{k} {f:.2f} / {b:.2f}" for k, (f, b) in ratios.items())
    missing = [k for k in LAYOUT_KINDS if k not in ratios]
    cores = gpu.capability >= 7.0 if swept == "bf16" else bool(gpu.tflops.get("tf32"))
    return ChannelsLast(ratios, (
        f"channels-last: convolutions and batch norms priced as in NCHW times the ratios the "
        f"{fitted['gpu']}'s {swept} kernels measured between the layouts ({said}: forward / "
        "backward)" + (f"; {', '.join(missing)} as NCHW" if missing else "")
        + ("" if cores else f"; the {gpu.name} runs {precision} convolutions without the "
               "tensor cores those kernels used")
        + "; not banded (docs/studies/channels-last.md)"))
