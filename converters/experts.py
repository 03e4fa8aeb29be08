"""A mixture of experts exported as balanced routing: every expert computes an equal share of
the routed tokens.

A router sends each token to its top k experts by value, which a weight-free export (meta
tensors, no values) cannot follow: how many tokens each expert gets is data. Training balances
the experts (an auxiliary loss or a bias keeps their loads even), so the export assumes the
balance it aims at: the T x k routed copies of the T tokens are sorted by expert (the
dispatch's gather), cut into E equal groups of ceil(T k / E) rows and pushed through the
experts as one batched GEMM each way (what grouped GEMM kernels run), gathered back to token
order and summed with the router's weights. FLOPs, parameters and the dispatch's copies are
those of perfectly balanced routing, no token dropped, on one GPU (expert parallelism is the
pricing's: the experts' GEMMs are found by their scope, `.../experts/MatMul`).

It plugs into transformers' experts interface (`transformers.integrations.moe`: the experts
of Mixtral, Qwen-MoE, DeepSeek, OLMoE, GPT-OSS and others share it) as one more
implementation, chosen per config (`config._experts_implementation`).
"""

from __future__ import annotations

from typing import Any

NAME = "mdot_balanced"
ROUTED: list[int] = []  # each token's experts (k), as each experts layer traced reads them


def balanced_forward(self: Any, hidden: Any, top_k_index: Any, top_k_weights: Any) -> Any:
    """The experts of `self` (a transformers experts module) on `hidden` [T, d], each token
    routed to `top_k_index` [T, k] with `top_k_weights` [T, k], as balanced routing."""
    import torch

    tokens, k = top_k_index.shape
    ROUTED.append(int(k))
    experts, d = self.num_experts, hidden.shape[-1]
    routed = tokens * k
    rows = (routed + experts - 1) // experts  # per expert (a traced // exports as ONNX's
    # truncating Div: the ceiling by negation came out one row short, a negative padding)
    order = torch.argsort(top_k_index.reshape(-1))  # [T k] the dispatch: copies by expert
    x = hidden.repeat_interleave(k, dim=0)[order]  # [T k, d]
    if rows * experts > routed:
        x = torch.cat([x, x.new_zeros(rows * experts - routed, d)])
    x = x.view(experts, rows, d)  # [E, rows, d]
    h = _linear(self, x, "gate_up_proj" if self.has_gate else "up_proj")  # [E, rows, 2I | I]
    h = self._apply_gate(h) if self.has_gate else self.act_fn(h)  # [E, rows, I]
    y = _linear(self, h, "down_proj")  # [E, rows, d]
    if getattr(self, "has_post_expert_norm", False):
        y = self.post_expert_norm(y)
    y = y.reshape(rows * experts, d)[:routed][torch.argsort(order)]  # [T k, d] token order
    y = y * top_k_weights.reshape(-1, 1).to(y.dtype)
    return y.view(tokens, k, d).sum(dim=1).to(hidden.dtype)  # [T, d]


def _linear(self: Any, x: Any, name: str) -> Any:
    """`x` [E, rows, in] through every expert's `name` weight ([E, out, in], or [E, in, out]
    where the module stores them transposed) and its bias: [E, rows, out]."""
    w = getattr(self, name)
    y = x @ (w if self.is_transposed else w.transpose(1, 2))
    if self.has_bias:
        y = y + getattr(self, f"{name}_bias")[:, None, :]
    return y


def describe(model: Any, experts: int, top_k: int) -> dict:
    """The mixture in `model` (built with `balanced`): its experts, each token's top k, the
    layers holding experts and the experts' parameters (their routers' apart)."""
    held = [m for m in model.modules() if hasattr(m, "num_experts") and hasattr(m, "down_proj")
            and not hasattr(m.down_proj, "weight")]  # the experts' stacked [E, out, in] weights
    return dict(experts=experts, top_k=top_k, layers=len(held),
                params=sum(p.numel() for m in held for p in m.parameters()))


def balanced(config: Any) -> bool:
    """Sets `config` (a transformers config) to export its experts as balanced routing;
    False where this transformers has no experts interface to plug into."""
    try:
        from transformers.integrations.moe import ExpertsInterface
    except ImportError:
        return False
    ExpertsInterface.register(NAME, balanced_forward)
    config._experts_implementation = NAME
    return True
