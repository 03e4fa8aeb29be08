"""Golden FLOPs of every op handler (the test cases live beside the handlers) and bytes."""

import numpy as np
import pytest
from onnx_builders import conv_bn_relu

from converters import CONFIG_FIELDS, LOAD_FIELDS, convert
from converters.ops import HANDLERS, TESTCASES, NodeView
from converters.vocab import UNK_ID, VOCAB, op_id

CASES = [(fn, i, kw, flops) for fn, cases in TESTCASES.items()
         for i, (kw, flops) in enumerate(cases)]


@pytest.mark.parametrize("handler,index,kwargs,expected", CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_handler_golden_flops(handler, index, kwargs, expected):
    view = NodeView(**kwargs)
    view.in_is_param = view.in_is_param or [False] * len(view.in_shapes)
    assert HANDLERS[view.op_type](view).flops == expected


def test_every_handler_has_a_case_and_every_op_a_handler_or_unk():
    assert all(TESTCASES[name] for name in TESTCASES), "a handler without test cases"
    assert len(VOCAB) >= 62  # >= 60 op types + <pad> + <unk>
    missing = [op for op in VOCAB[2:] if op not in HANDLERS]
    assert missing == [], f"vocabulary ops without a cost handler: {missing}"
    assert op_id("NoSuchOp") == UNK_ID


def test_conv_bn_relu_load_and_config_golden():
    seq = convert(conv_bn_relu(), batch_size=2)
    load = dict(zip(LOAD_FIELDS, seq.load[0]))  # the Conv
    cfg = dict(zip(CONFIG_FIELDS, seq.config[0]))
    # y[2,4,8,8]; per output 3*3*3 MACs -> 2 * 512 * 27 FLOPs, backward 2x
    assert load["fwd_flops"] == 2 * 512 * 27
    assert load["bwd_flops"] == 2 * load["fwd_flops"]
    # reads x (2*3*8*8) + w (4*3*3*3) floats, writes y (2*4*8*8) floats
    assert load["bytes_read"] == 4 * (384 + 108)
    assert load["bytes_written"] == 4 * 512
    assert load["params"] == 108
    assert load["intensity"] == pytest.approx(load["fwd_flops"] / (4 * (384 + 108 + 512)))
    assert (cfg["kernel_h"], cfg["kernel_w"], cfg["pad_h"], cfg["pad_w"]) == (3, 3, 2, 2)
    assert (cfg["in_channels"], cfg["out_channels"], cfg["groups"]) == (3, 4, 1)
    assert (cfg["out_d0"], cfg["out_d1"], cfg["out_d2"], cfg["out_d3"]) == (2, 4, 8, 8)
    bn = dict(zip(LOAD_FIELDS, seq.load[1]))
    # the inference-mode BN is read as the training step's (converters.training_view):
    # statistics 4 + normalise 2 + affine 2
    assert bn["fwd_flops"] == 8 * 512
    assert bn["params"] == 8  # scale and bias; running mean and variance are state
    assert seq.params == 108 + 8
    assert np.isfinite(seq.config).all() and np.isfinite(seq.load).all()


def test_every_operator_trait_is_of_a_known_type_and_kernel():
    """One registry says what GPU kernel a type runs and what its backward keeps; GPU pricing
    and step memory read it (no table of type names of their own)."""
    import re
    from pathlib import Path

    from converters.traits import TRAITS, keeping, of_kind
    from converters.vocab import VOCAB

    dropped = {"Identity", "Constant", "Shape", "Size"}  # never in a sequence
    assert set(TRAITS) - dropped <= set(VOCAB), set(TRAITS) - set(VOCAB)
    kernels = {"gemm", "conv", "rowwise", "binary", "unary", "copy", "dropout", "free", "stream",
               "other"}
    assert {tr.kernel for tr in TRAITS.values()} <= kernels
    priced = {"rowwise", "binary", "unary", "copy", "dropout"}
    assert all(tr.measured for tr in TRAITS.values() if tr.kernel in priced)
    assert not keeping("input") & keeping("output") and "Relu" in keeping("output")
    assert of_kind("rowwise")["Softmax"] == "softmax" and "Reshape" in of_kind("free")
    repo = Path(__file__).resolve().parents[1]
    for f in ("mdot_jax/gpu/spec_sheet.py", "mdot_jax/serving/memory.py"):
        assert not re.search(r"\{\s*\"(Relu|Softmax|Add|Concat|Conv)\"", (repo / f).read_text())


def test_an_l1_norm_is_a_known_reduction():
    """`x.norm(p=1, dim=-1)` (DBRX's router normalising its top-k weights) exports as
    ReduceL1, which the converter did not know: its FLOPs not counted, a warning per layer."""
    torch = pytest.importorskip("torch")
    from converters import from_torch

    class Normed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 4)

        def forward(self, x):  # [B, 8] -> [B, 4]
            y = self.lin(x)
            return y / y.norm(p=1, dim=-1, keepdim=True)

    seq = convert(from_torch(Normed(), torch.randn(2, 8)), batch_size=3)
    assert seq.unknown_ops == {}
    at = seq.op_names.tolist().index("ReduceL1")
    assert seq.load[at, LOAD_FIELDS.index("fwd_flops")] == 3 * 4  # one op per element
