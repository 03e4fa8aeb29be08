"""Losses PyTorch's exporter has no form of, as their formulas, each the value PyTorch
computes (`FORMULAS`: a name in `torch.nn.functional` -> the maker of its formula from torch
and the original; `patches.loss_formulas` puts them in place while a model is exported):
label smoothing in a cross entropy (timm's and transformers' default recipes), the L1, smooth
L1 and Huber losses (detection's boxes, reinforcement learning's values), the binary cross
entropy of probabilities (`nn.BCELoss`), the triplet margin, cosine embedding, margin ranking,
hinge embedding and multi-class / multi-label margin losses (metric learning, ranking), the
soft margin and Poisson likelihood losses."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any


def bound(original: Callable, formula: Callable) -> Callable:
    """`formula` called with `original`'s arguments by name, the legacy `size_average` /
    `reduce` read as the `reduction` they mean."""
    signature = inspect.signature(original)

    def call(*args: Any, **kwargs: Any) -> Any:
        given = signature.bind(*args, **kwargs)
        given.apply_defaults()
        a = dict(given.arguments)
        legacy = a.pop("size_average", None), a.pop("reduce", None)
        if legacy != (None, None):
            from torch.nn import _reduction

            a["reduction"] = _reduction.legacy_get_string(*legacy)
        return formula(**a)
    return call


def _reduced(loss: Any, reduction: str) -> Any:
    return loss.mean() if reduction == "mean" else loss.sum() if reduction == "sum" else loss


def _cross_entropy(torch: Any, original: Callable) -> Callable:
    """Label smoothing: (1 - e) x the cross entropy + e x the mean over classes of -log p, over
    the targets not ignored (weighted as PyTorch weighs them)."""
    import torch.nn.functional as F

    def loss(input, target, weight, ignore_index, reduction, label_smoothing):
        plain = dict(weight=weight, ignore_index=ignore_index, reduction=reduction)
        if not label_smoothing:
            return original(input, target, **plain)
        classes = input.shape[1] if input.dim() > 1 else input.shape[0]
        if target.is_floating_point():  # class probabilities: smoothed towards uniform
            target = target * (1 - label_smoothing) + label_smoothing / classes
            return original(input, target, **plain)
        logp = F.log_softmax(input, dim=1 if input.dim() > 1 else 0)
        if weight is not None:
            shape = [1] * logp.dim()
            shape[1 if logp.dim() > 1 else 0] = classes
            logp = logp * weight.reshape(shape)
        smooth = -logp.sum(dim=1 if logp.dim() > 1 else 0)  # shaped as the target
        kept = target != ignore_index
        smooth = smooth * kept
        if reduction == "mean":
            counted = kept.sum() if weight is None else \
                (weight[target.clamp(0, classes - 1)] * kept).sum()
            smooth = smooth.sum() / counted
        else:
            smooth = _reduced(smooth, reduction)
        return (1 - label_smoothing) * original(input, target, **plain) + \
            label_smoothing / classes * smooth
    return loss


def _smooth_l1(torch: Any, original: Callable) -> Callable:
    def loss(input, target, reduction, beta):
        d = (input - target).abs()
        if beta == 0:
            return _reduced(d, reduction)
        return _reduced(torch.where(d < beta, 0.5 * d * d / beta, d - 0.5 * beta), reduction)
    return loss


def _l1(torch: Any, original: Callable) -> Callable:
    def loss(input, target, reduction, weight=None):
        d = (input - target).abs()
        return _reduced(d if weight is None else d * weight, reduction)
    return loss


def _huber(torch: Any, original: Callable) -> Callable:
    def loss(input, target, reduction, delta, weight=None):
        d = (input - target).abs()
        out = torch.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta))
        return _reduced(out if weight is None else out * weight, reduction)
    return loss


def _triplet(torch: Any, original: Callable) -> Callable:
    def distance(x, y, p, eps):  # F.pairwise_distance
        return torch.linalg.vector_norm(x - y + eps, ord=p, dim=-1)

    def loss(anchor, positive, negative, margin, p, eps, swap, reduction):
        near, far = distance(anchor, positive, p, eps), distance(anchor, negative, p, eps)
        if swap:
            far = torch.minimum(far, distance(positive, negative, p, eps))
        return _reduced((margin + near - far).clamp_min(0), reduction)
    return loss


def _cosine_embedding(torch: Any, original: Callable) -> Callable:
    def loss(input1, input2, target, margin, reduction):
        eps = 1e-12  # PyTorch's
        cos = (input1 * input2).sum(-1) / ((input1 * input1).sum(-1) + eps).mul(
            (input2 * input2).sum(-1) + eps).sqrt()
        zero = torch.zeros_like(cos)
        return _reduced(torch.where(target == 1, 1 - cos, zero)
                        + torch.where(target == -1, (cos - margin).clamp_min(0), zero), reduction)
    return loss


def _binary_cross_entropy(torch: Any, original: Callable) -> Callable:
    def loss(input, target, weight, reduction):  # each log clamped at -100, as PyTorch does
        out = -(target * input.log().clamp_min(-100)
                + (1 - target) * (1 - input).log().clamp_min(-100))
        return _reduced(out if weight is None else out * weight, reduction)
    return loss


def _margin_ranking(torch: Any, original: Callable) -> Callable:
    def loss(input1, input2, target, margin, reduction):
        return _reduced((margin - target * (input1 - input2)).clamp_min(0), reduction)
    return loss


def _hinge_embedding(torch: Any, original: Callable) -> Callable:
    def loss(input, target, margin, reduction):
        zero = torch.zeros_like(input)
        return _reduced(torch.where(target != -1, input, zero)
                        + torch.where(target != 1, (margin - input).clamp_min(0), zero), reduction)
    return loss


def _soft_margin(torch: Any, original: Callable) -> Callable:
    def loss(input, target, reduction):
        return _reduced(torch.log1p((-target * input).exp()), reduction)
    return loss


def _poisson_nll(torch: Any, original: Callable) -> Callable:
    def loss(input, target, log_input, full, eps, reduction):
        out = input.exp() - target * input if log_input else input - target * (input + eps).log()
        if full:  # Stirling's approximation of log(target!), where target > 1
            stirling = target * target.log() - target + 0.5 * (2 * math.pi * target).log()
            out = out + stirling.masked_fill(target <= 1, 0)
        return _reduced(out, reduction)
    return loss


def _multi_margin(torch: Any, original: Callable) -> Callable:
    import torch.nn.functional as F

    def loss(input, target, p, margin, weight, reduction):  # [N, C] scores, [N] classes
        if input.dim() == 1:
            return loss(input[None], target.reshape(1), p, margin, weight, reduction).squeeze(0)
        c = input.shape[-1]
        out = (margin - input.gather(1, target.unsqueeze(-1)) + input).clamp_min(0) ** p
        if weight is not None:
            out = out * weight[target].unsqueeze(-1)
        out = out.masked_fill(F.one_hot(target, c).bool(), 0)  # over the other classes
        return _reduced(out.sum(-1) / c, reduction)
    return loss


def _multilabel_margin(torch: Any, original: Callable) -> Callable:
    import torch.nn.functional as F

    def loss(input, target, reduction):  # [N, C] scores; [N, C] classes, ended by a -1
        c = input.shape[-1]
        listed = (target < 0).cumsum(-1) == 0  # [N, J] the classes before the first -1
        index = target.clamp_min(0)
        chosen = (F.one_hot(index, c) * listed.unsqueeze(-1)).amax(-2).bool()  # [N, C]
        out = (1 - input.gather(input.dim() - 1, index).unsqueeze(-1)  # ONNX's axis
               + input.unsqueeze(-2)).clamp_min(0)
        out = out * listed.unsqueeze(-1) * (~chosen).unsqueeze(-2)  # [N, J, C]
        return _reduced(out.sum((-1, -2)) / c, reduction)
    return loss


FORMULAS = {"cross_entropy": _cross_entropy, "l1_loss": _l1, "smooth_l1_loss": _smooth_l1,
            "huber_loss": _huber, "triplet_margin_loss": _triplet,
            "cosine_embedding_loss": _cosine_embedding,
            "binary_cross_entropy": _binary_cross_entropy,
            "margin_ranking_loss": _margin_ranking, "hinge_embedding_loss": _hinge_embedding,
            "soft_margin_loss": _soft_margin, "poisson_nll_loss": _poisson_nll,
            "multi_margin_loss": _multi_margin, "multilabel_margin_loss": _multilabel_margin}
