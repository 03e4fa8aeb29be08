"""A speech recogniser's CTC loss as one node (`converters.ctc`)."""

import types

import numpy as np
import pytest
import torch

from converters import convert, from_torch
from converters.ctc import ctc_loss

CONFIG = types.SimpleNamespace(pad_token_id=0, ctc_loss_reduction="sum", ctc_zero_infinity=True)


class Recogniser(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(16, 32)

    def forward(self, x, labels):  # x [B, T, 16] features, labels [B, L]
        return ctc_loss(self.head(x), labels, CONFIG)


def test_the_ctc_node_computes_pytorchs_loss_and_gradient():
    """ONNX has no CTC loss and PyTorch's has no meta kernel: ours is PyTorch's on a CPU."""
    torch.manual_seed(0)
    model, x, labels = Recogniser(), torch.randn(2, 50, 16), torch.randint(1, 32, (2, 10))
    got = model(x, labels)
    got.backward()
    grad = model.head.weight.grad.clone()
    model.zero_grad()
    want = torch.nn.functional.ctc_loss(
        model.head(x).log_softmax(-1).transpose(0, 1), labels, torch.full((2,), 50),
        torch.full((2,), 10), reduction="sum", zero_infinity=True)
    want.backward()
    assert float(got) == pytest.approx(float(want), rel=1e-6)
    np.testing.assert_allclose(grad.numpy(), model.head.weight.grad.numpy(), atol=1e-5)


@pytest.mark.parametrize("meta", [False, True])
def test_the_ctc_loss_exports_as_one_node_and_follows_the_batch(meta):
    with torch.device("meta" if meta else "cpu"):
        model = Recogniser()
    graph = from_torch(model, (torch.randn(2, 50, 16), torch.randint(1, 32, (2, 10))))
    assert [n.op_type for n in graph.graph.node].count("CTCLoss") == 1
    small, large = (convert(graph, batch_size=b, seq_len=10) for b in (2, 8))
    assert large.meta["inputs"] == {"input0": [8, 50, 16], "input1": [8, 10]}
    assert "CTCLoss" in large.op_names and not large.unknown_ops
    assert large.flops == pytest.approx(4 * small.flops, rel=0.01)
