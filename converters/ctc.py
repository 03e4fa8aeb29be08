"""A speech recogniser's CTC loss (wav2vec 2.0's, HuBERT's, WavLM's `...ForCTC`) as one node:
ONNX has no CTC loss, and PyTorch's has no meta-device kernel. `ctc_loss` computes the loss
as transformers' CTC heads do (log-softmax in float32 over [frames, batch, vocabulary], the
blank its pad token, the config's reduction) on targets already padded to one length, so
that no data-dependent selection (their `masked_select` of the labels) enters the graph; it is
exported as one `CTCLoss` node of our domain, costed here (registered on import, by
`converters`)."""

from __future__ import annotations

import functools
from typing import Any

from converters.ops import Cost, NodeView, _in, register
from converters.state_space import DOMAIN, OWN_SHAPES

CTC_OP = "CTCLoss"
REDUCTIONS = ("mean", "sum")  # transformers' `ctc_loss_reduction`: the loss a scalar


def _scalar(inputs: list[str]) -> list[Any]:
    """The loss's shape for inference: a scalar (the sum of its first input)."""
    from onnx import helper

    return [helper.make_node("ReduceSum", [inputs[0]], ["y"], keepdims=0)]


OWN_SHAPES[(DOMAIN, CTC_OP)] = _scalar


def ctc_loss(logits: Any, labels: Any, config: Any) -> Any:
    """The CTC loss of `logits` [B, T, V] for `labels` [B, L] (every sample's frames and
    targets whole, as an example's are), blank `config.pad_token_id`, reduced by
    `config.ctc_loss_reduction` (`zero_infinity` as the config says)."""
    import torch

    reduction = getattr(config, "ctc_loss_reduction", "mean")
    if reduction not in REDUCTIONS:
        reduction = "mean"
    log_probs = torch.log_softmax(logits, dim=-1, dtype=torch.float32).transpose(0, 1)
    frames, targets = (torch.full(labels.shape[:1], n, dtype=torch.long, device=labels.device)
                       for n in (logits.shape[1], labels.shape[1]))  # [B] each
    return _node().apply(log_probs, labels, frames, targets, int(config.pad_token_id or 0),
                         reduction, bool(getattr(config, "ctc_zero_infinity", False)))


@functools.cache
def _node() -> Any:
    """The autograd Function whose trace is one `CTCLoss` node: PyTorch's loss on a CPU, an
    empty scalar on the meta device (torch imported late)."""
    import torch

    class Node(torch.autograd.Function):
        @staticmethod
        def forward(ctx, log_probs, labels, frames, targets, blank, reduction, zero_infinity):
            ctx.save_for_backward(log_probs, labels, frames, targets)
            ctx.args = blank, reduction, zero_infinity
            if log_probs.is_meta:
                return log_probs.new_empty(())
            return torch.nn.functional.ctc_loss(log_probs, labels, frames, targets, blank,
                                                reduction, zero_infinity)

        @staticmethod
        def backward(ctx, grad):
            log_probs, labels, frames, targets = ctx.saved_tensors
            with torch.enable_grad():
                x = log_probs.detach().requires_grad_()
                loss = torch.nn.functional.ctc_loss(x, labels, frames, targets, *ctx.args)
                (dx,) = torch.autograd.grad(loss, x, grad)
            return dx, None, None, None, None, None, None

        @staticmethod
        def symbolic(graph, log_probs, labels, frames, targets, blank, reduction,
                     zero_infinity):
            return graph.op(f"{DOMAIN}::{CTC_OP}", log_probs, labels, frames, targets,
                            blank_i=blank, reduction_s=reduction,
                            zero_infinity_i=int(zero_infinity)).setType(
                log_probs.type().with_sizes([]))

    return Node


@register(CTC_OP, testcases=(
    (dict(op_type=CTC_OP, in_shapes=[(50, 2, 32), (2, 10), (2,), (2,)], out_shapes=[()]),
     50 * 2 * 21 * 8 + 50 * 2 * 32),
))
def ctc(node: NodeView) -> Cost:
    """CTC: the forward recursion over a frame's 2 L + 1 states (a log-sum-exp of up to three
    terms: 8 FLOPs a state) and a read of every log-probability [T, B, V]; the backward twice
    that (the backward recursion, and the gradient of every log-probability)."""
    frames, batch, _ = node.in_shapes[0]
    states = 2 * node.in_shapes[1][-1] + 1
    return Cost(float(8 * frames * batch * states + _in(node)), 2.0, dict(axis=-1))
