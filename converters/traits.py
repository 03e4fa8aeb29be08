"""What each operator type is, beside how its cost is counted (`converters.ops`): the kernel a
GPU runs for it (and the measured operator that prices that kernel), and what its backward
keeps. One row per type; GPU step pricing (`mdot_jax.gpu.spec_sheet`) and step memory
(`mdot_jax.serving.memory`) read their tables from here.

Kernels: `gemm` and `conv` (priced as GEMMs), `rowwise` (a reduction along rows: softmax,
normalisations), `binary` and `unary` (elementwise), `copy` (moves bytes), `dropout`, `free`
(a view or a shape computation: no kernel in eager PyTorch), `stream` (a fused memory-bound
kernel: its bytes at the share of the bandwidth its measured operator reaches); a type without a
row is priced as a copy and warned about. `keeps`: the backward needs the operator's `input`
(all its inputs) or its `output` (PyTorch's derivatives), else nothing of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from converters.fusion import VIEWS


@dataclass(frozen=True)
class Traits:
    kernel: str = "other"
    measured: str = ""  # the GPU-measured operator that prices the kernel (`gpu.gpu_ops`)
    keeps: str = ""  # "input" | "output" | ""


TRAITS: dict[str, Traits] = {}


def _register(kernel: str, measured: str, *types: str, keeps: str = "") -> None:
    for t in types:
        assert t not in TRAITS, t
        TRAITS[t] = Traits(kernel, measured, keeps)


_register("gemm", "", "MatMul", "Gemm", "Einsum", keeps="input")
_register("gemm", "", "MatMulInteger")
_register("conv", "", "Conv", "ConvTranspose", keeps="input")
_register("rowwise", "softmax", "Softmax", "LogSoftmax", keeps="output")
# a loss over [N, C] scores: its rows are its input's (`LOSSES`); the backward keeps the
# log-probabilities, the input's size
_register("rowwise", "softmax", "SoftmaxCrossEntropyLoss", keeps="input")
_register("copy", "addu", "NegativeLogLikelihoodLoss")  # a pick of one score a row
LOSSES = frozenset({"SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"})
# CTC's recursions read the log-probabilities [T, B, V] by rows; its backward keeps them
_register("rowwise", "softmax", "CTCLoss", keeps="input")
_register("rowwise", "ln", "LayerNormalization", "GroupNormalization", "InstanceNormalization",
          "BatchNormalization", keeps="input")
_register("rowwise", "ln", "RMSNormalization", "LpNormalization")
_register("binary", "add", "Add", "Sub", "Equal", "Less", "Greater", "And", "Or", "Sum", "Mean",
          "BitwiseAnd", "BitwiseOr", "BitwiseXor")
_register("binary", "add", "Max", "Min", "Where", keeps="input")
_register("binary", "mul", "Mul", "PRelu", keeps="input")
_register("binary", "div", "Div", keeps="input")
_register("binary", "div", "Mod")
_register("binary", "pow", "Pow", keeps="input")
_register("unary", "gelu", "Gelu", keeps="input")
_register("unary", "tanh", "Tanh", "Sigmoid", "Exp", "Sqrt", "Reciprocal", keeps="output")
_register("unary", "tanh", "Erf", "Softplus", "Silu", "Mish", "Elu", "Selu", "HardSwish",
          "HardSigmoid", "Log", "Sin", "Cos", keeps="input")
_register("unary", "tanh", "Celu")
_register("unary", "relu", "Relu", keeps="output")
_register("unary", "relu", "LeakyRelu", "Clip", "Abs", keeps="input")
_register("unary", "relu", "Neg", "Floor", "Ceil", "Round", "Sign", "Not", "IsNaN", "IsInf",
          "Softsign", "BitwiseNot")
_register("copy", "addu", "Concat", "Split", "Slice", "Gather", "GatherElements", "GatherND",
          "ScatterND", "ScatterElements", "Expand", "Tile", "Pad", "DepthToSpace",
          "SpaceToDepth", "Cast", "CastLike", "Trilu", "OneHot")
_register("dropout", "mul", "Dropout")
# Mamba's (`state_space`), one pass over their tensors; ChunkScan's products stay on chip:
# priced as fused attention is
_register("stream", "add", "SelectiveScan", "ChunkScan", "CausalConv1d", "GatedRMSNorm",
          keeps="input")
_register("free", "", *sorted(set(VIEWS) - set(TRAITS)), "Identity", "Constant", "Shape", "Size")
_register("other", "", "MaxPool", keeps="input")
_register("other", "", "GridSample", keeps="input")  # its backward reads the values and grid
_register("other", "", "ReduceMax", "ReduceMin", keeps="input")


def of_kind(kernel: str) -> dict[str, str]:
    """Type -> measured operator of every type whose GPU kernel is `kernel`."""
    return {t: tr.measured for t, tr in TRAITS.items() if tr.kernel == kernel}


def keeping(what: str) -> frozenset[str]:
    """The types whose backward keeps their `input` or their `output`."""
    return frozenset(t for t, tr in TRAITS.items() if tr.keeps == what)
