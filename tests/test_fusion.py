"""Eager-kernel fusion (`converters.fusion`): decomposed GELU and SiLU become one operator,
no-op Dropout disappears, and look-alikes that are not those patterns stay as they are."""

import math

import numpy as np
import pytest
from onnx import helper

from converters import convert
from converters.vocab import VOCAB
from tests.onnx_builders import model, value


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
