"""Losses the exporter has no form of, exported as their formulas (`converters.losses`): each
formula computes PyTorch's value for every way it is called, and the exported graph does too."""

import numpy as np
import pytest

from converters import convert, from_torch
from converters.patches import loss_formulas

torch = pytest.importorskip("torch")
F = torch.nn.functional

X, Y = torch.randn(6, 5), torch.randn(6, 5)
T = torch.tensor([0, 4, 2, -100, 1, 3])  # one target ignored
T3 = torch.randint(0, 5, (2, 4, 3))  # [N, d1, d2] targets of [N, C, d1, d2] scores
W = torch.rand(5) + 0.5
SIGN = torch.tensor([1.0, -1.0, 1.0, -1.0, 0.0, 1.0])
CALLS = [
    ("cross_entropy", (X, T), dict(label_smoothing=0.1)),
    ("cross_entropy", (X, T), dict(label_smoothing=0.2, weight=W)),
    ("cross_entropy", (X, T), dict(label_smoothing=0.1, reduction="sum")),
    ("cross_entropy", (X, T.clamp(0)), dict(label_smoothing=0.1, reduction="none")),
    ("cross_entropy", (torch.randn(2, 5, 4, 3), T3), dict(label_smoothing=0.3)),
    ("cross_entropy", (X, F.softmax(Y, -1)), dict(label_smoothing=0.1)),  # probabilities
    ("cross_entropy", (X, T), dict(ignore_index=-100)),  # no smoothing: PyTorch's own
    ("smooth_l1_loss", (X, Y), {}), ("smooth_l1_loss", (X, Y), dict(beta=0.5, reduction="sum")),
    ("smooth_l1_loss", (X, Y), dict(beta=0.0)),
    ("smooth_l1_loss", (X, Y), dict(size_average=False)),  # the legacy form of "sum"
    ("l1_loss", (X, Y), {}), ("l1_loss", (X, Y), dict(reduction="none")),
    ("huber_loss", (X, Y), dict(delta=0.7)), ("huber_loss", (X, Y), dict(reduction="none")),
    ("triplet_margin_loss", (X, Y, X * 0.5), {}),
    ("triplet_margin_loss", (X, Y, X * 0.5), dict(margin=0.3, p=1, swap=True, reduction="none")),
    ("cosine_embedding_loss", (X, Y, SIGN), dict(margin=0.2)),
    ("cosine_embedding_loss", (X, Y, SIGN), dict(reduction="none")),
    ("binary_cross_entropy", (X.sigmoid(), Y.sigmoid()), {}),
    ("binary_cross_entropy", (X.sigmoid(), (Y > 0).float()), dict(weight=W, reduction="sum")),
    ("margin_ranking_loss", (X[:, 0], Y[:, 0], SIGN), dict(margin=0.3)),
    ("hinge_embedding_loss", (X, SIGN[:, None].expand(6, 5)), dict(margin=0.5)),
    ("soft_margin_loss", (X, SIGN[:, None].expand(6, 5)), dict(reduction="none")),
    ("poisson_nll_loss", (X, Y.abs() * 3), {}),
    ("poisson_nll_loss", (X.abs(), Y.abs() * 3), dict(log_input=False, full=True)),
    ("multi_margin_loss", (X, T.clamp(0)), {}),
    ("multi_margin_loss", (X, T.clamp(0)), dict(p=2, margin=0.5, weight=W, reduction="none")),
    ("multi_margin_loss", (X[0], T[0]), {}),
    ("multilabel_margin_loss", (X, torch.tensor([[3, 0, -1, 1, 2]] * 3 + [[4, 2, 1, 0, 3]]
                                                + [[-1, 1, 1, 1, 1]] * 2)), {}),
]


@pytest.mark.parametrize("name,args,kw", CALLS)
def test_each_formula_is_pytorchs_value(name, args, kw):
    expected = getattr(F, name)(*args, **kw)
    with loss_formulas(torch):
        got = getattr(F, name)(*args, **kw)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert getattr(F, name).__name__ == name  # restored


class Step(torch.nn.Module):  # one linear layer, then the loss
    def __init__(self, loss):
        super().__init__()
        self.linear, self.loss = torch.nn.Linear(5, 5), loss

    def forward(self, x, *rest):
        return self.loss(self.linear(x), *rest)


@pytest.mark.parametrize("loss,rest", [
    (torch.nn.CrossEntropyLoss(label_smoothing=0.1), (T,)),
    (torch.nn.SmoothL1Loss(), (Y,)), (torch.nn.L1Loss(), (Y,)),
    (torch.nn.HuberLoss(delta=0.5), (Y,)),
    (torch.nn.TripletMarginLoss(), (Y, X * 0.5)), (torch.nn.CosineEmbeddingLoss(), (Y, SIGN)),
    (lambda x, t: torch.nn.BCELoss()(x.sigmoid(), t), (Y.sigmoid(),)),
    (torch.nn.MultiMarginLoss(), (T.clamp(0),)),
    (torch.nn.MultiLabelMarginLoss(), (torch.tensor([[3, 0, -1, 1, 2]] * 6),))])
def test_a_step_ending_in_the_loss_exports_its_value(loss, rest):
    """Each failed to export: "ONNX does not support label_smoothing", "Exporting the operator
    'aten::smooth_l1_loss' ... is not supported", and so on."""
    from onnx.reference import ReferenceEvaluator

    step = Step(loss)
    graph = from_torch(step, (X, *rest))
    feeds = {f"input{i}": t.numpy() for i, t in enumerate((X, *rest))}
    feeds.update({n: p.detach().numpy() for n, p in step.named_parameters()})
    got = ReferenceEvaluator(graph).run(None, feeds)[0]
    np.testing.assert_allclose(got, step(X, *rest).detach().numpy(), rtol=1e-5, atol=1e-6)
    assert convert(graph, batch_size=12).params == 30
