"""Versioned operator-type vocabulary.

Ids are stable within a `VOCAB_VERSION`: new op types are only ever appended (and the version
bumped), so a checkpoint trained on version N keeps its meaning. Id 0 is padding, id 1 is
`<unk>` for op types outside the vocabulary (counted in `OperatorSequence.unknown_ops`).
"""

VOCAB_VERSION = 11  # 2: Col2Im; 3: Silu (converters.fusion); 4: the losses; 5: SelectiveScan;
# 6: ChunkScan; 7: CausalConv1d, GatedRMSNorm; 8: ReduceL1, ReduceLogSum; 9: detectors' ops;
# 10: CTCLoss; 11: GridSample
PAD, UNK = "<pad>", "<unk>"

_OP_TYPES = (
    # contractions
    "Conv", "ConvTranspose", "Gemm", "MatMul", "Einsum",
    # normalisation
    "BatchNormalization", "LayerNormalization", "GroupNormalization",
    "InstanceNormalization", "LpNormalization", "RMSNormalization",
    # pooling
    "MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool",
    # softmax / reductions
    "Softmax", "LogSoftmax", "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin",
    "ReduceProd", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp", "ArgMax", "ArgMin",
    "CumSum", "TopK",
    # activations and unary math
    "Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Celu", "Sigmoid", "HardSigmoid",
    "HardSwish", "Tanh", "Gelu", "Erf", "Softplus", "Softsign", "Mish", "Exp", "Log",
    "Sqrt", "Reciprocal", "Neg", "Abs", "Floor", "Ceil", "Round", "Sign", "Clip",
    "Sin", "Cos", "Not", "IsNaN", "IsInf",
    # binary / variadic elementwise
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Sum", "Mean", "Where",
    "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor",
    # data movement
    "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Concat", "Split",
    "Slice", "Gather", "GatherElements", "GatherND", "ScatterND", "ScatterElements",
    "Expand", "Tile", "Pad", "Resize", "Upsample", "DepthToSpace", "SpaceToDepth", "Cast",
    "CastLike", "Trilu", "OneHot", "NonZero", "ConstantOfShape", "Range",
    # regularisation and randomness
    "Dropout", "RandomUniform", "RandomUniformLike", "RandomNormal", "RandomNormalLike",
    "Bernoulli",
    # recurrent and control flow
    "LSTM", "GRU", "RNN", "If", "Loop", "Scan",
    "MatMulInteger",
    # appended in version 2
    "Col2Im",
    # appended in version 3: not an ONNX op; fused Sigmoid(x) * x
    "Silu",
    # appended in version 4: a training graph's loss
    "SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss",
    # appended in version 5: not an ONNX op; Mamba-1's fused scan (converters.state_space)
    "SelectiveScan",
    # appended in version 6: not an ONNX op; Mamba-2's chunked scan (converters.state_space)
    "ChunkScan",
    # appended in version 7: not ONNX ops; Mamba-2's causal conv1d and gated RMSNorm
    "CausalConv1d", "GatedRMSNorm",
    # appended in version 8: `x.norm(p=1)` (DBRX's router), log of a sum
    "ReduceL1", "ReduceLogSum",
    # appended in version 9: torchvision's detectors: integer masks' `|`, `&`, `^`, `~`, RoIs
    # pooled, proposals suppressed
    "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot", "RoiAlign", "NonMaxSuppression",
    # appended in version 10: not an ONNX op; speech recognisers' CTC loss (converters.ctc)
    "CTCLoss",
    # appended in version 11: deformable attention's samples (DETR's kin, Mask2Former's)
    "GridSample",
)

VOCAB: tuple[str, ...] = (PAD, UNK) + _OP_TYPES
OP_TO_ID: dict[str, int] = {op: i for i, op in enumerate(VOCAB)}
PAD_ID, UNK_ID = OP_TO_ID[PAD], OP_TO_ID[UNK]
assert len(OP_TO_ID) == len(VOCAB), "duplicate op type in the vocabulary"


def op_id(op_type: str) -> int:
    """Vocabulary id of an ONNX op type; `UNK_ID` when the type is not in the vocabulary."""
    return OP_TO_ID.get(op_type, UNK_ID)
