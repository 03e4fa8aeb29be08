"""Eager-kernel fusion (`converters.fusion`): decomposed GELU and SiLU become one operator,
no-op Dropout disappears, and look-alikes that are not those patterns stay as they are."""

import math

import numpy as np
import pytest
from onnx import helper
from onnx_builders import model, value

from converters import convert
from converters.vocab import VOCAB


def _const(name, v):
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(
        name + "_t", 1, [], [v]))


def _graph(extra_gelu_consumer=False, gate_from_other=False, dropout_ratio=0.0):
    """x -> GELU (5 ops) -> SiLU (2 ops) -> Dropout -> SE-like gate -> y."""
    nodes = [_const("sqrt2", math.sqrt(2)), _const("one", 1.0), _const("half", 0.5),
             _const("ratio", dropout_ratio),
             helper.make_node("Constant", [], ["train"], value=helper.make_tensor(
                 "train_t", 9, [], [True])),
             helper.make_node("Div", ["x", "sqrt2"], ["d"]),
             helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["a"]),
             helper.make_node("Mul", ["x", "a"], ["m"]),
             helper.make_node("Mul", ["m", "half"], ["g"]),
             helper.make_node("Sigmoid", ["g"], ["s"]),
             helper.make_node("Mul", ["s", "g"], ["h"]),
             helper.make_node("Dropout", ["h", "ratio", "train"], ["o", "mask"]),
             # a gate: Sigmoid of one tensor times another is not SiLU
             helper.make_node("Sigmoid", ["x" if gate_from_other else "o"], ["gs"]),
             helper.make_node("Mul", ["o", "gs"], ["y"])]
    outputs = [value("y", None)] + ([value("e", None)] if extra_gelu_consumer else [])
    m = model(nodes, [value("x", [2, 8])], outputs)
    m.metadata_props.add(key="mdot.data_inputs", value="x")
    return m


def _ops(seq):
    return [VOCAB[t] for t in seq.op_type]


def test_gelu_silu_and_noop_dropout_are_fused():
    plain, fused = convert(_graph()), convert(_graph(), fuse=True)
    assert _ops(plain) == ["Div", "Erf", "Add", "Mul", "Mul", "Sigmoid", "Mul", "Dropout",
                           "Sigmoid", "Mul"]
    # the last Sigmoid reads `o`, which the Mul also reads: that is SiLU too
    assert _ops(fused) == ["Gelu", "Silu", "Silu"]
    assert fused.meta["fused"] == {"gelu": 1, "silu": 2, "dropout": 1}
    assert "fused" not in plain.meta
    assert [tuple(e) for e in fused.edges] == [(0, 1), (1, 2)]
    # one pass over [2, 8] floats per kernel now: 64 bytes read, 64 written
    np.testing.assert_allclose(fused.load[:, 2:4], 64.0)
    assert fused.load[:, 2:4].sum() < plain.load[:, 2:4].sum() / 3


@pytest.mark.parametrize("kw, kept", [
    (dict(extra_gelu_consumer=True), ["Div", "Erf", "Add", "Mul", "Mul"]),  # `e` is an output
    (dict(gate_from_other=True), ["Gelu", "Silu", "Sigmoid", "Mul"]),  # a gate, not SiLU
    (dict(dropout_ratio=0.1), ["Gelu", "Silu", "Dropout", "Silu"]),  # a real dropout
])
def test_look_alikes_are_not_fused(kw, kept):
    assert _ops(convert(_graph(**kw), fuse=True))[:len(kept)] == kept


def test_torch_modules_fuse_to_their_kernels():
    torch = pytest.importorskip("torch")
    from converters import from_torch

    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Dropout(0.0),
                              torch.nn.Linear(8, 8), torch.nn.SiLU(), torch.nn.Dropout(0.5))
    seq = convert(from_torch(net, torch.randn(2, 8)), batch_size=4, fuse=True)
    assert seq.meta["fused"] == {"gelu": 1, "silu": 1, "dropout": 1}
    assert [op for op in _ops(seq) if op not in ("Gemm", "MatMul", "Add")] == \
        ["Gelu", "Silu", "Dropout"]


def test_views_stay_in_the_sequence_but_move_no_bytes():
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[1, 0]),
             helper.make_node("Relu", ["t"], ["y"])]
    m = model(nodes, [value("x", [2, 8])], [value("y", None)])
    m.metadata_props.add(key="mdot.data_inputs", value="x")
    plain, fused = convert(m), convert(m, fuse=True)
    assert _ops(fused) == _ops(plain) == ["Relu", "Transpose", "Relu"]
    np.testing.assert_allclose(plain.load[1, 2:4], 64.0)  # 16 floats read and written
    np.testing.assert_allclose(fused.load[1, 2:4], 0.0)
    np.testing.assert_allclose(fused.load[[0, 2]], plain.load[[0, 2]])  # the kernels unchanged
    assert fused.meta["fused"] == {"views": 1}


def test_running_statistics_no_framework_computes_are_dropped_from_version_2():
    """Weight standardisation (timm's StdConv2d, NF-Nets: `F.batch_norm(w, None, None,
    training=True)`) exports ReduceMean/Sub/Mul that compute running statistics only because
    ONNX requires them; version 2 drops them, keeps both BatchNormalizations' rows, and
    version 1 (what older checkpoints convert with) still has them."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    from converters import from_torch

    class StdConvBN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(8, 3, 3, 3))
            self.bn = torch.nn.BatchNorm2d(8)

        def forward(self, x):
            w = F.batch_norm(self.w.reshape(1, 8, -1), None, None, training=True,
                             momentum=0.0, eps=1e-5).reshape_as(self.w)
            return torch.relu(self.bn(F.conv2d(x, w)))

    graph = from_torch(StdConvBN(), torch.randn(2, 3, 8, 8))
    v1, v2 = convert(graph, batch_size=2, fuse=1), convert(graph, batch_size=2, fuse=2)
    assert (v1.fusion, v2.fusion) == (1, 2) and v2.meta["fused"]["batch_stats"] == 1
    assert "batch_stats" not in v1.meta["fused"]
    assert {"ReduceMean", "Sub", "Mul"} <= set(_ops(v1))
    assert not {"ReduceMean", "Sub", "Mul"} & set(_ops(v2))
    kept = [op for op in _ops(v1) if op in ("BatchNormalization", "Conv", "Relu")]
    assert [op for op in _ops(v2) if op not in ("Reshape",)] == kept
    rows = [i for i, op in enumerate(_ops(v1)) if op in kept]
    rows2 = [i for i, op in enumerate(_ops(v2)) if op in kept]
    np.testing.assert_array_equal(v1.config[rows], v2.config[rows2])
    np.testing.assert_array_equal(v1.load[rows], v2.load[rows2])
    assert v1.params == v2.params == 8 * 27 + 16
    # an upgraded copy of a dataset converts this graph again, and reuses a plain one
    from converters import converts_the_same

    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8))
    plain = convert(from_torch(net, torch.randn(2, 3, 8, 8)), batch_size=2, fuse=1)
    assert converts_the_same(plain, 2) and not converts_the_same(v1, 2)
    assert not converts_the_same(v2, 2) and not converts_the_same(plain, 1)  # same version


def test_only_what_reaches_nothing_but_the_statistics_is_dropped():
    """`z` feeds the variance and also an output: Sub stays, the two ReduceMeans go."""
    nodes = [helper.make_node("ReduceMean", ["x"], ["mean"], axes=[0, 2, 3], keepdims=0),
             helper.make_node("Sub", ["x", "x"], ["z"]),
             helper.make_node("ReduceMean", ["z"], ["var"], axes=[0, 2, 3], keepdims=0),
             helper.make_node("BatchNormalization", ["x", "s", "b", "mean", "var"],
                              ["y", "rm", "rv"], training_mode=1),
             helper.make_node("Relu", ["z"], ["r"])]
    m = model(nodes, [value("x", [2, 4, 3, 3]), value("s", [4]), value("b", [4])],
              [value("y", None), value("r", None)])
    m.metadata_props.add(key="mdot.data_inputs", value="x")
    assert _ops(convert(m, fuse=1)) == ["ReduceMean", "Sub", "ReduceMean",
                                        "BatchNormalization", "Relu"]
    assert _ops(convert(m, fuse=2)) == ["Sub", "BatchNormalization", "Relu"]


def test_torchs_tanh_gelu_is_one_kernel_from_version_3_and_python_arithmetic_is_not():
    """`gelu(x, approximate="tanh")` (Gemma's `gelu_pytorch_tanh`) runs as one kernel that
    keeps its input; the TorchScript exporter writes it as nine operators. transformers'
    `gelu_new` computes the same in Python (`Pow(x, 3)`, `0.5 * x` first): nine kernels in
    eager PyTorch too, left as they are. Fused, the step holds fewer tensors and moves fewer
    bytes; version 2 keeps the chain and a plain sequence converts the same at version 3."""
    torch = pytest.importorskip("torch")
    from converters import converts_the_same, from_torch

    class Act(torch.nn.Module):
        def __init__(self, native):
            super().__init__()
            self.fc, self.native = torch.nn.Linear(8, 16), native

        def forward(self, x):
            h = self.fc(x)
            if self.native:
                return torch.nn.functional.gelu(h, approximate="tanh").sum()
            return (0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi)
                                                * (h + 0.044715 * torch.pow(h, 3.0))))).sum()

    native = from_torch(Act(True), torch.randn(2, 8))
    v2, v3 = convert(native, batch_size=2, fuse=2), convert(native, batch_size=2, fuse=3)
    assert _ops(v3) == ["Gemm", "Gelu", "ReduceSum"] and v3.meta["fused"] == {"gelu_tanh": 1}
    assert "Tanh" in _ops(v2) and len(v2.op_type) == 11
    assert v3.load[:, 2:4].sum() < v2.load[:, 2:4].sum() / 3
    python = convert(from_torch(Act(False), torch.randn(2, 8)), batch_size=2, fuse=3)
    assert _ops(python)[1:] == ["Mul", "Pow", "Mul", "Add", "Mul", "Tanh", "Add", "Mul",
                                "ReduceSum"]
    # a copy or predictor of the other version takes a sequence only where it is the same
    assert not converts_the_same(v2, 3) and not converts_the_same(v3, 2)
    assert converts_the_same(python, 2)  # nothing of version 3 fused in it
    plain = convert(from_torch(torch.nn.Linear(8, 8), torch.randn(2, 8)), batch_size=2, fuse=2)
    assert converts_the_same(plain, 3)


def _sliced(cuts, step=1):
    """x [2, 12] cut by Slices (axis, start, end), each piece through a Relu."""
    nodes, outs = [], []
    for k, (axis, start, end) in enumerate(cuts):
        for name, v in (("s", start), ("e", end), ("a", axis), ("t", step)):
            nodes.append(helper.make_node("Constant", [], [f"{name}{k}"], value=helper.make_tensor(
                f"{name}{k}_t", 7, [1], [v])))
        nodes += [helper.make_node("Slice", ["x", f"s{k}", f"e{k}", f"a{k}", f"t{k}"], [f"p{k}"]),
                  helper.make_node("Relu", [f"p{k}"], [f"y{k}"])]
        outs.append(value(f"y{k}", None))
    m = model(nodes, [value("x", [2, 12])], outs)
    m.metadata_props.add(key="mdot.data_inputs", value="x")
    return m


@pytest.mark.parametrize("cuts, step, split", [
    ([(1, 0, 4), (1, 4, 8), (1, 8, 2 ** 62)], 1, True),  # dynamo's chunk / unbind
    ([(-1, 6, 12), (1, 0, -6)], 1, True),  # any order, negative axis and end
    ([(1, 0, 4), (1, 4, 12)], 1, False),  # unequal (Mamba's pieces, read in place)
    ([(1, 0, 4), (1, 2, 12)], 1, False),  # overlapping
    ([(1, 0, 4), (1, 4, 8)], 1, False),  # not all of it
    ([(1, 0, 6), (0, 0, 2)], 1, False),  # two axes
    ([(1, 0, 6), (1, 6, 12)], 2, False),  # strided
])
def test_slices_cutting_a_tensor_into_pieces_are_one_split_from_version_3(cuts, step, split):
    """The dynamo exporter writes `unbind` and `chunk` as one Slice a piece, each priced as a
    kernel reading the whole tensor; the TorchScript exporter writes one Split. From version
    3 equal pieces that cover an axis once are that Split; other Slices stay."""
    v2, v3 = (convert(_sliced(cuts, step), fuse=v) for v in (2, 3))
    assert _ops(v2).count("Slice") == len(cuts)
    if split:
        assert _ops(v3) == ["Split"] + ["Relu"] * len(cuts)
        assert v3.meta["fused"]["slices"] == 1
        np.testing.assert_allclose(v3.load[0, 2:4], 2 * 12 * 4)  # x read once, written once
    else:
        assert _ops(v3) == _ops(v2) and "slices" not in v3.meta["fused"]


def test_an_unknown_fusion_version_is_refused():
    from converters import ConversionError

    m = _graph()
    with pytest.raises(ConversionError, match="fusion version 9: this converter knows"):
        convert(m, fuse=9)


def test_a_fusion_version_out_of_range_names_the_range():
    from converters import ConversionError
    from converters.fusion import FUSION_VERSION, fusion_version

    assert fusion_version(True) == FUSION_VERSION and fusion_version(False) == 0
    with pytest.raises(ConversionError, match=r"knows versions 1 to \d \(0: none\)$"):
        fusion_version(-1)  # not "a newer mdot wrote it"
    with pytest.raises(ConversionError, match="a newer mdot wrote it"):
        fusion_version(FUSION_VERSION + 1)
