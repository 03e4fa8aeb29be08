"""Per-operator handlers: forward FLOPs and configuration of one ONNX node.

Each op family registers one handler with `@register(op_type, ..., testcases=[...])`. A handler
gets a `NodeView` (shapes already concrete, host-side) and returns a `Cost`. Everything that is
the same for every op (shapes, bytes read and written, parameter count) is computed once in
`sequence.py`; handlers only add what is specific to their family.

FLOP conventions (a multiply-add is 2 FLOPs; documented per handler):
- contractions: 2 * MACs (+ 1 per output for a bias);
- normalisations: 4 per element for the statistics (mean 1, variance 3), 2 to normalise,
  2 for the affine part; BatchNormalization in inference mode skips the statistics;
- elementwise: a fixed cost per output element (`_UNARY_COST`), 1 per input pair for binary;
- pooling: kernel size per output element (+1 for the average's division);
- data movement (Reshape, Transpose, Gather, ...): 0 FLOPs, only bytes.
The backward pass is estimated as `bwd_factor * fwd`: 2 for contractions (gradient with respect
to both operands), 1 for everything else, 0 for ops that do not propagate gradients.

Test cases are `(NodeView kwargs, expected fwd FLOPs)` with the arithmetic written out; they run
in `tests/test_ops.py`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

from onnx import helper

from converters.errors import ConversionError

Shape = tuple[int, ...]


class NodeView:
    """What a handler may look at: one node with concrete shapes (None where unknown).

    `attrs` is parsed from `proto` on first access (most handlers never look at it).
    """

    __slots__ = ("op_type", "name", "in_shapes", "out_shapes", "in_is_param", "proto",
                 "_attrs")

    def __init__(self, op_type: str, attrs: dict | None = None, in_shapes=(), out_shapes=(),
                 in_is_param=None, name: str = "", proto=None):
        self.op_type, self.name, self.proto, self._attrs = op_type, name, proto, attrs
        self.in_shapes: list = list(in_shapes)  # [n_in] Shape | None
        self.out_shapes: list = list(out_shapes)  # [n_out] Shape | None
        self.in_is_param: list = list(in_is_param or [False] * len(self.in_shapes))

    @property
    def attrs(self) -> dict:
        if self._attrs is None:
            self._attrs = {a.name: _attr_value(a) for a in self.proto.attribute} \
                if self.proto is not None else {}
        return self._attrs


def _attr_value(a):
    value = helper.get_attribute_value(a)
    return value.decode() if isinstance(value, bytes) else value


class Cost(NamedTuple):
    flops: float  # forward FLOPs
    bwd_factor: float = 1.0  # backward FLOPs = bwd_factor * flops
    config: dict | None = None  # CONFIG_FIELDS name -> value, for the op-specific fields


Handler = Callable[[NodeView], Cost]
# Inputs that are state, not trainable parameters (not counted as params): op -> input indices.
STATE_INPUTS = {"BatchNormalization": (3, 4)}
HANDLERS: dict[str, Handler] = {}
TESTCASES: dict[str, list] = {}


def register(*op_types: str, testcases: tuple = ()):
    """Registers `fn` as the handler of `op_types`; `testcases` are (NodeView kwargs, flops)."""

    def deco(fn: Handler) -> Handler:
        for op in op_types:
            if op in HANDLERS:
                raise ValueError(f"two handlers for op type {op}")
            HANDLERS[op] = fn
        TESTCASES[fn.__name__] = list(testcases)
        return fn

    return deco


def numel(shape: Shape | None) -> int:
    return math.prod(shape) if shape is not None else 0


def _out(node: NodeView, i: int = 0) -> int:
    return numel(node.out_shapes[i]) if len(node.out_shapes) > i else 0


def _in(node: NodeView, i: int = 0) -> int:
    return numel(node.in_shapes[i]) if len(node.in_shapes) > i else 0


def _pair(values, default: int) -> tuple[int, int]:
    """Last two entries of a per-spatial-dim attribute as (h, w); 1-D gives (1, w)."""
    values = list(values) if values else []
    if not values:
        return default, default
    if len(values) == 1:
        return 1, values[0]
    return values[-2], values[-1]


def _pads(pads, n_spatial: int) -> tuple[int, int]:
    """Total padding (begin + end) of the last two spatial dims."""
    if not pads:
        return 0, 0
    totals = [pads[i] + pads[i + n_spatial] for i in range(n_spatial)]
    return (0, totals[0]) if n_spatial == 1 else (totals[-2], totals[-1])


def _window_config(node: NodeView, kernel: list[int]) -> dict:
    n_spatial = len(kernel)
    kh, kw = _pair(kernel, 1)
    sh, sw = _pair(node.attrs.get("strides"), 1)
    dh, dw = _pair(node.attrs.get("dilations"), 1)
    ph, pw = _pads(node.attrs.get("pads"), n_spatial)
    return dict(kernel_h=kh, kernel_w=kw, stride_h=sh, stride_w=sw, pad_h=ph, pad_w=pw,
                dilation_h=dh, dilation_w=dw)


# ---------------------------------------------------------------------------- contractions
@register("Conv", "ConvTranspose", testcases=(
    # grouped: x[2,8,10,10] w[16,4,3,3] groups=2 -> y[2,16,10,10]; MACs = 2*16*100 * 4*9
    (dict(op_type="Conv", attrs=dict(group=2, kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
          in_shapes=[(2, 8, 10, 10), (16, 4, 3, 3)], out_shapes=[(2, 16, 10, 10)]),
     2 * (2 * 16 * 100) * (4 * 9)),
    # dilated with bias: x[1,3,9,9] w[4,3,3,3] b[4] dilation 2 -> y[1,4,5,5]
    (dict(op_type="Conv", attrs=dict(dilations=[2, 2]),
          in_shapes=[(1, 3, 9, 9), (4, 3, 3, 3), (4,)], out_shapes=[(1, 4, 5, 5)]),
     2 * (4 * 25) * (3 * 9) + 4 * 25),
    # transposed: every input element scatters into Cout/g * k outputs
    (dict(op_type="ConvTranspose", attrs=dict(strides=[2, 2]),
          in_shapes=[(1, 4, 5, 5), (4, 6, 2, 2)], out_shapes=[(1, 6, 10, 10)]),
     2 * (4 * 25) * (6 * 4)),
))
def conv(node: NodeView) -> Cost:
    """Conv: 2 * N * Cout * out_spatial * (Cin / g) * prod(kernel) (+ bias)."""
    x, w = node.in_shapes[0], node.in_shapes[1]
    groups = node.attrs.get("group", 1)
    kernel = list(node.attrs.get("kernel_shape") or (w[2:] if w else []))
    cfg = _window_config(node, kernel)
    bias = len(node.in_shapes) > 2 and node.in_shapes[2] is not None
    k = math.prod(kernel)
    if node.op_type == "ConvTranspose":  # w: [Cin, Cout/g, *k]
        c_in, c_out = w[0], w[1] * groups
        macs = numel(x) * (c_out // groups) * k
    else:  # w: [Cout, Cin/g, *k]
        c_in, c_out = w[1] * groups, w[0]
        macs = _out(node) * (c_in // groups) * k
    if len(x) > 1 and x[1] != c_in:  # shape inference lets this pass
        raise ConversionError(f"node '{node.name}' ({node.op_type}): its input has {x[1]} "
                              f"channels, its weight {list(w)} (group {groups}) expects "
                              f"{c_in}; check --input-shape")
    out_spatial = _out(node) // max(c_out, 1) // max(x[0], 1)
    cfg.update(groups=groups, in_channels=c_in, out_channels=c_out, mm_batch=groups,
               mm_m=x[0] * out_spatial, mm_k=(c_in // groups) * k, mm_n=c_out // groups)
    return Cost(2.0 * macs + (_out(node) if bias else 0), 2.0, cfg)


@register("Gemm", testcases=(
    # A[8,32] B^T given as [16,32] (transB) + C[16]: 2*8*32*16 + 8*16
    (dict(op_type="Gemm", attrs=dict(transB=1), in_shapes=[(8, 32), (16, 32), (16,)],
          out_shapes=[(8, 16)]), 2 * 8 * 32 * 16 + 8 * 16),
))
def gemm(node: NodeView) -> Cost:
    """Gemm: 2 * M * K * N, + M * N for C."""
    a = node.in_shapes[0]
    k = a[0] if node.attrs.get("transA", 0) else a[1]
    m, n = node.out_shapes[0]
    bias = len(node.in_shapes) > 2 and node.in_shapes[2] is not None
    cfg = dict(mm_batch=1, mm_m=m, mm_k=k, mm_n=n, in_channels=k, out_channels=n)
    return Cost(2.0 * m * k * n + (m * n if bias else 0), 2.0, cfg)


@register("MatMul", "MatMulInteger", testcases=(
    # batched with broadcast: [4,1,8,16] @ [3,16,5] -> [4,3,8,5]: 2 * 12 * 8*16*5
    (dict(op_type="MatMul", in_shapes=[(4, 1, 8, 16), (3, 16, 5)], out_shapes=[(4, 3, 8, 5)]),
     2 * 12 * 8 * 16 * 5),
    # vector @ matrix: [16] @ [16,5] -> [5]
    (dict(op_type="MatMul", in_shapes=[(16,), (16, 5)], out_shapes=[(5,)]), 2 * 16 * 5),
))
def matmul(node: NodeView) -> Cost:
    """MatMul (numpy semantics): 2 * prod(output) * K."""
    a = node.in_shapes[0]
    k = a[-1]
    out = node.out_shapes[0]
    m = a[-2] if len(a) > 1 else 1
    n = node.in_shapes[1][-1] if len(node.in_shapes[1]) > 1 else 1
    batch = numel(out) // max(m * n, 1)
    cfg = dict(mm_batch=batch, mm_m=m, mm_k=k, mm_n=n, in_channels=k, out_channels=n)
    return Cost(2.0 * numel(out) * k, 2.0, cfg)


@register("Einsum", testcases=(
    # "bhqd,bhkd->bhqk" with b=2 h=3 q=4 k=5 d=8: 2 * product of every index size
    (dict(op_type="Einsum", attrs=dict(equation="bhqd,bhkd->bhqk"),
          in_shapes=[(2, 3, 4, 8), (2, 3, 5, 8)], out_shapes=[(2, 3, 4, 5)]),
     2 * 2 * 3 * 4 * 5 * 8),
))
def einsum(node: NodeView) -> Cost:
    """Einsum: 2 * product of the sizes of all distinct indices (one multiply-add each)."""
    lhs = node.attrs.get("equation", "").replace(" ", "").split("->")[0]
    sizes: dict[str, int] = {}
    for term, shape in zip(lhs.split(","), node.in_shapes):
        letters = [c for c in term if c.isalpha()]
        if shape is None or "..." in term or len(letters) != len(shape):
            return Cost(2.0 * _out(node), 2.0)  # ellipsis: fall back to the output size
        for c, d in zip(letters, shape):
            sizes[c] = max(sizes.get(c, 1), d)
    return Cost(2.0 * math.prod(sizes.values()), 2.0)


# ---------------------------------------------------------------------------- normalisation
_STATS, _NORMALISE, _AFFINE = 4, 2, 2


@register("BatchNormalization", "LayerNormalization", "GroupNormalization",
          "InstanceNormalization", "RMSNormalization", "LpNormalization", testcases=(
    # training-mode BN on [2,4,3,3]: (stats 4 + normalise 2 + affine 2) per element
    (dict(op_type="BatchNormalization", attrs=dict(training_mode=1),
          in_shapes=[(2, 4, 3, 3), (4,), (4,), (4,), (4,)], out_shapes=[(2, 4, 3, 3)]),
     8 * 72),
    # opset-11 training BN: no attribute, the running and saved statistics as outputs
    (dict(op_type="BatchNormalization", in_shapes=[(2, 4, 3, 3), (4,), (4,), (4,), (4,)],
          out_shapes=[(2, 4, 3, 3), (4,), (4,), (4,), (4,)]), 8 * 72),
    # inference-mode BN: normalise + affine only
    (dict(op_type="BatchNormalization", in_shapes=[(2, 4, 3, 3), (4,), (4,), (4,), (4,)],
          out_shapes=[(2, 4, 3, 3)]), 4 * 72),
    # LayerNorm over [2,5,16] with scale and bias
    (dict(op_type="LayerNormalization", attrs=dict(axis=-1),
          in_shapes=[(2, 5, 16), (16,), (16,)], out_shapes=[(2, 5, 16)]), 8 * 160),
    # LayerNorm without bias
    (dict(op_type="LayerNormalization", in_shapes=[(2, 5, 16), (16,)],
          out_shapes=[(2, 5, 16)]), 7 * 160),
))
def normalization(node: NodeView) -> Cost:
    """Statistics 4/elt (not for inference BN), normalise 2/elt, 1/elt per scale and bias."""
    n = _in(node)
    # BatchNormalization trains with `training_mode=1`, or (before opset 14) with the running
    # statistics as extra outputs
    training = (node.op_type != "BatchNormalization" or node.attrs.get("training_mode", 0)
                or len(node.out_shapes) > 1)
    affine = sum(1 for s in node.in_shapes[1:3] if s is not None)
    if node.op_type == "BatchNormalization":
        affine = _AFFINE
    flops = n * ((_STATS if training else 0) + _NORMALISE + affine)
    x = node.in_shapes[0]
    cfg = dict(training_mode=int(bool(training)), in_channels=x[1] if len(x) > 1 else x[0],
               axis=node.attrs.get("axis", 1 if node.op_type != "LayerNormalization" else -1),
               groups=node.attrs.get("num_groups", 1))
    return Cost(float(flops), 1.0, cfg)


# ---------------------------------------------------------------------------- pooling
@register("MaxPool", "AveragePool", "LpPool", testcases=(
    # max 3x3 stride 2 on [1,2,7,7] -> [1,2,3,3]: 9 comparisons per output
    (dict(op_type="MaxPool", attrs=dict(kernel_shape=[3, 3], strides=[2, 2]),
          in_shapes=[(1, 2, 7, 7)], out_shapes=[(1, 2, 3, 3)]), 9 * 18),
    # average 2x2 on [1,1,4,4] -> [1,1,2,2]: 4 adds + 1 division per output
    (dict(op_type="AveragePool", attrs=dict(kernel_shape=[2, 2], strides=[2, 2]),
          in_shapes=[(1, 1, 4, 4)], out_shapes=[(1, 1, 2, 2)]), 5 * 4),
))
def pool(node: NodeView) -> Cost:
    """Windowed pooling: prod(kernel) per output element, +1 for the average's division."""
    kernel = list(node.attrs.get("kernel_shape", [1]))
    per_out = math.prod(kernel) + (node.op_type != "MaxPool")
    cfg = _window_config(node, kernel)
    cfg.update(in_channels=node.in_shapes[0][1], out_channels=node.in_shapes[0][1])
    return Cost(float(_out(node) * per_out), 1.0, cfg)


@register("GlobalAveragePool", "GlobalMaxPool", testcases=(
    (dict(op_type="GlobalAveragePool", in_shapes=[(2, 8, 7, 7)], out_shapes=[(2, 8, 1, 1)]),
     2 * 8 * 49 + 2 * 8),
))
def global_pool(node: NodeView) -> Cost:
    """Global pooling: one op per input element (+1 per output for the average)."""
    x = node.in_shapes[0]
    extra = _out(node) if node.op_type == "GlobalAveragePool" else 0
    cfg = dict(kernel_h=x[-2] if len(x) > 3 else 1, kernel_w=x[-1], in_channels=x[1],
               out_channels=x[1])
    return Cost(float(_in(node) + extra), 1.0, cfg)


# ---------------------------------------------------------------------------- softmax, reductions
@register("Softmax", "LogSoftmax", testcases=(
    # max, subtract, exp, sum, divide: 5 per element
    (dict(op_type="Softmax", attrs=dict(axis=-1), in_shapes=[(2, 3, 10)],
          out_shapes=[(2, 3, 10)]), 5 * 60),
))
def softmax(node: NodeView) -> Cost:
    """Softmax: max, subtract, exp, sum and divide (log for LogSoftmax): 5 per element."""
    return Cost(5.0 * _in(node), 1.0, dict(axis=node.attrs.get("axis", -1)))


@register("SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss", testcases=(
    # the log-softmax's 5 and the pick of the target's: 6 per logit
    (dict(op_type="SoftmaxCrossEntropyLoss", in_shapes=[(8, 100), (8,)], out_shapes=[()]),
     6 * 800),
    (dict(op_type="NegativeLogLikelihoodLoss", in_shapes=[(8, 100), (8,)], out_shapes=[()]),
     800),
))
def loss(node: NodeView) -> Cost:
    """A classification loss over [N, C] scores (C at axis 1): softmax cross-entropy is a
    log-softmax (5 per score) and the pick of the target's (1); the negative log-likelihood
    only the pick."""
    per = 6.0 if node.op_type == "SoftmaxCrossEntropyLoss" else 1.0
    return Cost(per * _in(node), 1.0, dict(axis=1))


@register("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
          "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp", "ArgMax", "ArgMin",
          "CumSum", "TopK", testcases=(
    (dict(op_type="ReduceMean", attrs=dict(axes=[1]), in_shapes=[(4, 6)],
          out_shapes=[(4, 1)]), 24),
))
def reduction(node: NodeView) -> Cost:
    """Reductions: one op per input element."""
    axes = node.attrs.get("axes", node.attrs.get("axis"))
    axis = axes[0] if isinstance(axes, (list, tuple)) and axes else axes
    no_grad = node.op_type in ("ArgMax", "ArgMin")
    return Cost(float(_in(node)), 0.0 if no_grad else 1.0,
                dict(axis=axis if axis is not None else -1))


# ---------------------------------------------------------------------------- elementwise
_UNARY_COST = {
    "Relu": 1, "LeakyRelu": 2, "Elu": 3, "Selu": 4, "Celu": 3, "Sigmoid": 4,
    "HardSigmoid": 3, "HardSwish": 4, "Silu": 5, "Tanh": 1, "Gelu": 8, "Erf": 1, "Softplus": 3,
    "Softsign": 3, "Mish": 5, "Exp": 1, "Log": 1, "Sqrt": 1, "Reciprocal": 1, "Neg": 1,
    "Abs": 1, "Floor": 1, "Ceil": 1, "Round": 1, "Sign": 1, "Clip": 2, "Sin": 1, "Cos": 1,
    "Not": 1, "IsNaN": 1, "IsInf": 1, "BitwiseNot": 1,
}


@register(*_UNARY_COST, testcases=(
    (dict(op_type="Relu", in_shapes=[(2, 5)], out_shapes=[(2, 5)]), 10),
    (dict(op_type="Sigmoid", in_shapes=[(3,)], out_shapes=[(3,)]), 12),
))
def unary(node: NodeView) -> Cost:
    """Unary elementwise: `_UNARY_COST[op]` per output element."""
    return Cost(float(_UNARY_COST[node.op_type] * _out(node)), 1.0)


_NO_GRAD = {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor",
            "Not", "IsNaN", "IsInf", "Sign", "Floor", "Ceil", "Round"}


@register("Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Sum", "Mean", "Where",
          "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor",
          "PRelu", "BitwiseAnd", "BitwiseOr", "BitwiseXor", testcases=(
    # broadcast [4,1,3] + [5,1] -> [4,5,3]: one add per output
    (dict(op_type="Add", in_shapes=[(4, 1, 3), (5, 1)], out_shapes=[(4, 5, 3)]), 60),
    # variadic Sum of 3 inputs: 2 adds per output
    (dict(op_type="Sum", in_shapes=[(6,), (6,), (6,)], out_shapes=[(6,)]), 12),
))
def binary(node: NodeView) -> Cost:
    """Binary / variadic elementwise: (inputs - 1) ops per output element (Where: 1)."""
    n_in = sum(1 for s in node.in_shapes if s is not None)
    per_out = 1 if node.op_type in ("Where", "PRelu") else max(n_in - 1, 1)
    bwd = 0.0 if node.op_type in _NO_GRAD or node.op_type.startswith("Bitwise") else 1.0
    return Cost(float(per_out * _out(node)), bwd)


@register("Dropout", testcases=(
    # training: draw the mask and multiply: 2 per element
    (dict(op_type="Dropout", in_shapes=[(4, 8), (), ()], out_shapes=[(4, 8), (4, 8)],
          attrs=dict(training_mode=1)), 64),
))
def dropout(node: NodeView) -> Cost:
    """Dropout: draw the mask and scale, 2 per element (the graph passes `training_mode`)."""
    return Cost(2.0 * _in(node), 1.0, dict(training_mode=1))


@register("RandomUniform", "RandomUniformLike", "RandomNormal", "RandomNormalLike",
          "Bernoulli", testcases=(
    (dict(op_type="RandomUniformLike", in_shapes=[(3, 4)], out_shapes=[(3, 4)]), 12),
))
def random(node: NodeView) -> Cost:
    """Random number generation: 1 per output element, no gradient."""
    return Cost(float(_out(node)), 0.0)


# ---------------------------------------------------------------------------- data movement
_MOVEMENT = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Concat", "Split",
             "Slice", "Gather", "GatherElements", "GatherND", "ScatterND", "ScatterElements",
             "Expand", "Tile", "Pad", "DepthToSpace", "SpaceToDepth", "Cast", "CastLike",
             "Trilu", "OneHot", "NonZero", "ConstantOfShape", "Range", "Identity")


@register(*_MOVEMENT, testcases=(
    (dict(op_type="Transpose", attrs=dict(perm=[1, 0]), in_shapes=[(3, 4)],
          out_shapes=[(4, 3)]), 0),
))
def movement(node: NodeView) -> Cost:
    """Data movement: no arithmetic, the cost is the bytes moved (computed generically)."""
    axis = node.attrs.get("axis")
    return Cost(0.0, 1.0, dict(axis=axis) if isinstance(axis, int) else None)


@register("Resize", "Upsample", testcases=(
    # bilinear upsampling to [1,2,8,8]: 4 taps * (mul + add) per output
    (dict(op_type="Resize", attrs=dict(mode="linear"), in_shapes=[(1, 2, 4, 4)],
          out_shapes=[(1, 2, 8, 8)]), 8 * 128),
    (dict(op_type="Resize", attrs=dict(mode="nearest"), in_shapes=[(1, 2, 4, 4)],
          out_shapes=[(1, 2, 8, 8)]), 0),
))
def resize(node: NodeView) -> Cost:
    """Resize: nearest is a copy; linear 4 taps (8 FLOPs), cubic 16 taps (32) per output."""
    per_out = {"nearest": 0, "linear": 8, "cubic": 32}.get(node.attrs.get("mode", "nearest"), 0)
    return Cost(float(per_out * _out(node)), 1.0)


@register("Col2Im", testcases=(
    # [N, C*kh*kw, L] = [1, 2*2*2, 9] columns scattered back into [1, 2, 4, 4]: an add each
    (dict(op_type="Col2Im", in_shapes=[(1, 8, 9), (2,), (2,)], out_shapes=[(1, 2, 4, 4)]), 72),
))
def col2im(node: NodeView) -> Cost:
    """Col2Im (opset 18; VOLO's fold): every column element is added into the image."""
    return Cost(float(_in(node)), 1.0)


# ---------------------------------------------------------------------------- recurrent, control
@register("LSTM", "GRU", "RNN", testcases=(
    # LSTM: seq 5, batch 2, input 8, hidden 16: 4 gates * 2*(8+16)*16 per step and sample
    (dict(op_type="LSTM", attrs=dict(hidden_size=16), in_shapes=[(5, 2, 8), (1, 64, 8),
                                                                 (1, 64, 16)],
          out_shapes=[(5, 1, 2, 16)]), 5 * 2 * 4 * 2 * (8 + 16) * 16),
))
def recurrent(node: NodeView) -> Cost:
    """Recurrent layers: per step and sample, gates * 2 * (input + hidden) * hidden."""
    seq, batch, inp = node.in_shapes[0]
    hidden = node.attrs.get("hidden_size", 1)
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[node.op_type]
    directions = 2 if node.attrs.get("direction", "forward") == "bidirectional" else 1
    flops = directions * seq * batch * gates * 2 * (inp + hidden) * hidden
    return Cost(float(flops), 2.0, dict(mm_batch=seq * batch, mm_k=inp + hidden,
                                        mm_n=gates * hidden, out_channels=hidden))


@register("SelectiveScan", testcases=(
    (dict(op_type="SelectiveScan", in_shapes=[(2, 8, 16), (2, 8, 16), (8, 4), (2, 4, 16),
                                               (2, 4, 16), (8,), (2, 8, 16), (8,)],
          out_shapes=[(2, 8, 16)]), 9 * 2 * 8 * 16 * 4 + 2 * 2 * 8 * 16),
))
def selective_scan(node: NodeView) -> Cost:
    """Mamba-1's fused selective scan (`converters.state_space`): 9 FLOPs a token, channel and
    state (mamba_ssm's count), and the skip and the gate one each a token and channel; the
    backward runs the scan again and in reverse (2x)."""
    u, n = _in(node, 0), node.in_shapes[2][1]
    return Cost(float(9 * u * n + 2 * u), 2.0)


@register("ChunkScan", testcases=(
    (dict(op_type="ChunkScan", attrs=dict(chunk=4, groups=1),
          in_shapes=[(2, 8, 12), (2, 8, 3), (3,), (2, 8, 5), (2, 8, 5), (3,)],
          out_shapes=[(2, 8, 12)]),
     2 * 2 * (2 * 16 * 5 + 3 * (2 * 16 * 4 + 4 * 4 * 5 * 4)) + 2 * 3 * 2 * 4 * 4 * 5
     + 2 * 2 * 8 * 12),
))
def chunk_scan(node: NodeView) -> Cost:
    """Mamba-2's chunked scan (`converters.state_space`: x [B, T, H P], dt [B, T, H], A, B, C
    [B, T, G N], D; chunks of Q tokens): a chunk's C B^T once a group (2 Q^2 N), a head's
    2 Q^2 P + 4 Q N P, the states passed between the nc chunks (2 nc^2 P N a head), the skip
    (2 a token and feature); the backward about twice (2x)."""
    (b, t, dim), h = node.in_shapes[0], node.in_shapes[1][-1]
    q, g = int(node.attrs.get("chunk", 1)), int(node.attrs.get("groups", 1))
    p, n, nc = dim // h, node.in_shapes[3][-1] // g, -(-t // q)
    flops = b * nc * (g * 2 * q * q * n + h * (2 * q * q * p + 4 * q * n * p)) \
        + b * h * 2 * nc * nc * p * n + 2 * b * t * dim
    return Cost(float(flops), 2.0)


@register("CausalConv1d", "GatedRMSNorm", testcases=tuple(
    (dict(op_type=op, in_shapes=[(2, 8, 12), second, (12,)], out_shapes=[(2, 8, 12)]), flops)
    for op, second, flops in (("CausalConv1d", (12, 4), 2 * 8 * 12 * (2 * 4 + 4)),
                              ("GatedRMSNorm", (2, 8, 12), 10 * 2 * 8 * 12))))
def mamba2_pass(node: NodeView) -> Cost:
    """Mamba-2's one-pass kernels (`converters.state_space`), an element of x [B, T, C]: the
    causal conv1d's W multiply-adds, bias and silu; the gated RMSNorm's 10. Backward twice."""
    each = 2 * node.in_shapes[1][-1] + 4 if node.op_type == "CausalConv1d" else 10
    return Cost(float(_in(node, 0) * each), 2.0)


@register("If", "Loop", "Scan", testcases=(
    (dict(op_type="If", in_shapes=[()], out_shapes=[(3,)]), 0),
))
def control_flow(node: NodeView) -> Cost:
    """Control flow: the body is not expanded; counted as 0 FLOPs (bytes only)."""
    return Cost(0.0, 1.0)
