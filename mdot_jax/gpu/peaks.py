"""Which of a GPU's spec-sheet peaks each operator of a training step runs at, by precision,
and what backs the price of the tensor-core GEMMs (`spec_sheet.price` reads them).

The rules:
- `fp32` is PyTorch's default: matmuls on the fp32 CUDA cores, convolutions in TF32 where the
  GPU has TF32 tensor cores (cuDNN's default); `tf32`: both in TF32; `amp-fp16`, `amp-bf16`,
  `bf16`: matmuls and convolutions at that 16-bit tensor-core peak; under autocast the
  kernels it keeps in fp32 (softmax, norms, the update) read and write fp32, at `bf16` (the
  whole model in bfloat16) every kernel reads and writes two bytes an element.
- `fp8` (Transformer Engine's or torchao's float8 training): as `amp-bf16`, but the linear
  layers' GEMMs (forward, data and weight gradients; weights of sides that are multiples of
  16, as FP8 GEMMs take them) at the FP8 peak, priced at the share of
  it that a lent GPU's measured FP8 GEMMs reach (a step model's `fp8_gemms`, fitted on a kernel
  sweep by `tensor_cores.fit_sweep_gemms`), with the fixed cost of the 16-bit GEMMs (a sweep's
  own fixed cost holds its call). A GPU without FP8 on its spec sheet is a one-line error.
- GEMMs on tensor cores are priced at the share of the peak measured GEMMs reach
  (`tensor_cores`); MFU divides the FLOPs' time at the peaks each reaches
  (`peak_ms`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from converters import OperatorSequence
from converters.attention import Block, needed
from converters.sequence import CONFIG_FIELDS
from converters.traits import TRAITS
from mdot_jax import autograd
from mdot_jax.gpu import catalog as gpus
from mdot_jax.gpu.catalog import GPU
from mdot_jax.gpu.classify import classified
from mdot_jax.gpu.tensor_cores import ARITHMETIC, Constants, TensorCoreGemms

_KEYS = CONFIG_FIELDS.index("mm_n")  # a MatMul Q K^T's keys a query

# the spec sheet's tensor-core peak a precision's matmuls run at
TENSOR_CORE_PEAK = {"tf32": "tf32", "amp-fp16": "fp16", "amp-bf16": "bf16", "bf16": "bf16",
                    "fp8": "bf16"}
LINEAR_PEAK = {"fp8": "fp8"}  # where the linear layers' GEMMs run at another peak
MULTIPLE = 16  # FP8 GEMMs take dims of multiples of this (`torch._scaled_mm`, TE, torchao)
CONV_OPS = [t for t, tr in TRAITS.items() if tr.kernel == "conv"]


def matmul_peak(gpu: GPU, precision: str) -> float:
    """Dense TFLOP/s a matmul can reach at `precision`: the tensor cores' peak for it where
    the GPU has one, else the CUDA cores' fp32."""
    tc = TENSOR_CORE_PEAK.get(precision)
    return (gpu.tflops.get(tc) if tc else None) or gpu.tflops["fp32"]


def linear_peak(gpu: GPU, precision: str) -> float:
    """A linear layer's GEMMs': FP8's at `fp8` (a ValueError where the GPU has none), else the
    matmuls'."""
    peak = LINEAR_PEAK.get(precision)
    if peak is None:
        return matmul_peak(gpu, precision)
    if not gpu.tflops.get(peak):
        raise ValueError(f"precision {precision}: the {gpu.name} has no {peak} tensor cores on "
                         "its spec sheet (Ada and Hopper, compute capability 8.9 and later, "
                         f"have them): use {'amp-bf16' if gpu.tflops.get('bf16') else 'amp-fp16'}")
    return gpu.tflops[peak]


def takes_linear_peak(dims: Sequence[int]) -> bool:
    """Whether a linear layer's GEMM (B, M, N, K) runs at `LINEAR_PEAK`: its weight's sides
    multiples of `MULTIPLE` (others, a vocabulary of 50,257 say, stay at the 16-bit peak)."""
    return dims[2] % MULTIPLE == 0 and dims[3] % MULTIPLE == 0


def conv_peak(gpu: GPU, precision: str) -> float:
    """A convolution's: the matmuls' but at fp32, which PyTorch's cuDNN runs in TF32 where the
    GPU has it (`torch.backends.cudnn.allow_tf32`)."""
    tc = TENSOR_CORE_PEAK.get(precision)
    return matmul_peak(gpu, precision) if tc else gpu.tflops.get("tf32") or gpu.tflops["fp32"]


def seen_by_class(gpu: GPU, precision: str, measured: Sequence[str] = ()
                  ) -> tuple[dict[str, GPU], dict[str, str]]:
    """The GPU as seen by each class of operator (`gemm`, `linear`, `conv`, `memory`, `fp32`:
    what autocast keeps in fp32, in bfloat16 at `bf16`) at `precision`, and per class (`gemm`,
    `conv`) the warning that says what is not measured (`measured`: the tensor-core arithmetic
    whose GEMMs of this GPU the model was fitted on)."""
    fp32, warnings, linear = gpu.tflops["fp32"], {}, linear_peak(gpu, precision)
    tc = TENSOR_CORE_PEAK.get(precision)
    half = tc if precision.startswith("amp") or precision in (*LINEAR_PEAK, "bf16") else None
    if tc and not gpu.tflops.get(tc):
        if half == "bf16":
            raise ValueError(f"precision {precision!r}: the {gpu.name} has no bf16 arithmetic "
                             "on its spec sheet (no bf16 peak); give precision amp-fp16")
        warnings["gemm"] = warnings["conv"] = (
            f"{gpu.name} has no {tc} tensor cores on its spec sheet: its matmuls and "
            "convolutions priced at the fp32 peak")
    gemm_peak, conv = matmul_peak(gpu, precision), conv_peak(gpu, precision)
    if tc and gpu.tflops.get(tc):
        # measured GEMMs of this GPU at this arithmetic were fitted: its matmuls are backed
        # (and a step model's tensor-core GEMMs replace the matmuls' line: one line a class)
        for c, what, peak in (("gemm", "matmuls", gemm_peak), ("conv", "convolutions", conv)):
            if not (c == "gemm" and tc in measured):
                warnings[c] = (f"{precision} {what} priced from the {gpu.name}'s {tc} peak "
                               f"({peak:g} TFLOP/s): the operator measurements they were "
                               "fitted on are fp32, so this is not measured yet")
    elif not tc and gpu.tflops.get("tf32"):
        warnings["conv"] = (f"convolutions run in TF32 under PyTorch's defaults on the "
                            f"{gpu.name}: priced from its TF32 peak ({conv:g} TFLOP/s), "
                            "not measured yet")
    width = 2 if half else 4
    gemm, memory = gpus.as_seen(gpu, gemm_peak, width), gpus.as_seen(gpu, fp32, width)
    return dict(gemm=gemm, linear=gpus.as_seen(gpu, linear, 1) if precision in LINEAR_PEAK
                else gemm, conv=gpus.as_seen(gpu, conv, width), memory=memory,
                fp32=memory if precision == "bf16" else gpu), warnings


def nearest_gemms(info: dict, gpu: GPU) -> dict | None:
    """Of a step model's tensor-core constants measured on other GPUs (`tensor_core_gemms_of`:
    a GPU's name -> its `TensorCoreGemms`), those of `gpu` itself, else of a GPU of its
    architecture (the same tensor cores), else None: the step model's own (`tensor_core_gemms`,
    the H100's) price it."""
    of = info.get("tensor_core_gemms_of") or {}
    return of.get(gpu.name) or next((d for name, d in sorted(of.items())
                                     if gpus.find(name).architecture == gpu.architecture), None)


def tensor_core_gemms(info: dict, gpu: GPU, precision: str
                      ) -> tuple[str, TensorCoreGemms, str] | None:
    """(the spec sheet's peak, the tensor-core GEMMs of a step model's `info`, the warning that
    says what backs them) where `precision` runs GEMMs on tensor cores `gpu` has and the model
    holds them."""
    peak = TENSOR_CORE_PEAK.get(precision)
    d = info.get("tensor_core_gemms")
    if not (peak and d and gpu.tflops.get(peak)):
        return None
    gemms = TensorCoreGemms.from_json(nearest_gemms(info, gpu) or d)
    c = gemms.constants[ARITHMETIC[peak]]
    where = "measured on this GPU" if gpu.name == gemms.gpu else "not measured on this GPU"
    what = (f"{precision}: the matmuls not in {LINEAR_PEAK[precision]} (attention's, linear layers "
             f"with sides not multiples of {MULTIPLE}), at {peak},"
            if precision in LINEAR_PEAK else f"{precision} matmuls")
    return peak, gemms, (
        f"{what} priced at {c.share_compute:.0%} of the {gpu.name}'s {peak} peak "
        f"and a {1e3 * c.fixed_ms:.0f} us fixed cost, what the {gemms.gpu}'s measured GEMMs "
        f"reach ({c.mape:.0f}% MAPE over {c.rows}): {where}")


def linear_gemms(info: dict, gpu: GPU, precision: str) -> tuple[Constants, str] | None:
    """Where `precision` runs the linear layers' GEMMs at another peak (`LINEAR_PEAK`): their
    constants (a step model's `fp8_gemms`, with the 16-bit GEMMs' fixed cost) and the warning
    that says what backs them; a model without them prices them as 16-bit GEMMs at that peak."""
    peak, half = LINEAR_PEAK.get(precision), tensor_core_gemms(info, gpu, precision)
    if peak is None or half is None:
        return None
    base, fitted = half[1].constants["half"], info.get(f"{peak}_gemms")
    if not fitted:
        return base, (f"{precision}: the linear layers' GEMMs priced at the {gpu.name}'s {peak} "
                      f"peak ({gpu.tflops[peak]:g} TFLOP/s) as 16-bit GEMMs reach theirs: no "
                      f"{peak} GEMMs measured")
    c = Constants(fitted["share_compute"], fitted["share_memory"], base.fixed_ms,
                  fitted["rows"], fitted["mape"])
    where = "" if gpu.name == fitted["gpu"] else ", not measured on this GPU"
    return c, (f"{precision}: the linear layers' GEMMs priced at {c.share_compute:.0%} of the "
               f"{gpu.name}'s {peak} peak ({gpu.tflops[peak]:g} TFLOP/s), what the "
               f"{fitted['gpu']}'s measured {peak} GEMMs reach ({c.mape:.0f}% MAPE over "
               f"{c.rows}){where}; their inputs, weights and output gradients each scaled "
               "and cast per tensor (two memory-bound kernels each); no fp8 training step "
               "measured")


def peak_ms(seq: OperatorSequence, gpu: GPU, precision: str,
            blocks: Sequence[Block] = ()) -> float:
    """ms `seq`'s forward and backward FLOPs take at the peaks they can reach at `precision`:
    convolutions at theirs, linear layers at theirs, the rest at the matmuls' (MFU: this over
    the step's time). An attention block of `blocks` counts its scores' and output's FLOPs at
    the keys its queries need (`converters.attention.needed`: the causal half, or its sliding
    window; the graph computes them all, then masks). With frozen parameters, the backward
    autograd runs (`autograd`)."""
    flops = seq.column("fwd_flops") + autograd.backward_flops(seq)  # [N]
    for b in blocks:
        flops[[b.scores, b.output]] *= needed(b, int(seq.config[b.scores, _KEYS]))
    conv = np.isin(seq.op_names, CONV_OPS)
    linear = np.zeros(len(conv), bool)
    if precision in LINEAR_PEAK:
        linear = np.asarray([op == "linear" and takes_linear_peak(dims)
                             for _, op, dims in classified(seq)], bool)
    rest = ~(conv | linear)
    return 1e-9 * (float(flops[conv].sum()) / conv_peak(gpu, precision)
                   + float(flops[linear].sum()) / linear_peak(gpu, precision)
                   + float(flops[rest].sum()) / matmul_peak(gpu, precision))
