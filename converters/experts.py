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

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

NAME = "mdot_balanced"
ROUTED: list[int] = []  # each token's experts (k), as each experts layer traced reads them


def balanced_forward(self: Any, hidden: Any, top_k_index: Any, top_k_weights: Any) -> Any:
    """The experts of `self` (a transformers experts module) on `hidden` [T, d], each token
    routed to `top_k_index` [T, k] with `top_k_weights` [T, k], as balanced routing."""

    def compute(x: Any) -> Any:  # [E, rows, d] -> [E, rows, d]
        h = _linear(self, x, "gate_up_proj" if self.has_gate else "up_proj")  # [E, rows, 2I | I]
        h = self._apply_gate(h) if self.has_gate else self.act_fn(h)  # [E, rows, I]
        y = _linear(self, h, "down_proj")
        return self.post_expert_norm(y) if getattr(self, "has_post_expert_norm", False) else y

    return dispatched(hidden, top_k_index, top_k_weights, self.num_experts, compute)


def dispatched(hidden: Any, top_k_index: Any, top_k_weights: Any, experts: int,
               compute: Callable[[Any], Any]) -> Any:
    """`hidden` [T, d] routed to `top_k_index` [T, k] with `top_k_weights` [T, k] through
    `experts` experts, `compute` ([E, rows, d] -> [E, rows, d]: every expert on its rows), as
    balanced routing: [T, d]."""
    import torch

    tokens, k = top_k_index.shape
    ROUTED.append(int(k))
    order = torch.argsort(top_k_index.reshape(-1))  # [T k] the dispatch: copies by expert
    y = _shared(hidden.repeat_interleave(k, dim=0)[order], experts, compute)  # [T k, d]
    y = y[torch.argsort(order)] * top_k_weights.reshape(-1, 1).to(y.dtype)  # token order
    return y.view(tokens, k, -1).sum(dim=1).to(hidden.dtype)  # [T, d]


def _shared(x: Any, experts: int, compute: Callable[[Any], Any]) -> Any:
    """`x` [R, in], rows sorted by expert, cut into `experts` equal shares (the last padded)
    through `compute` ([E, rows, in] -> [E, rows, out]): [R, out]."""
    import torch

    routed = x.shape[0]
    rows = (routed + experts - 1) // experts  # per expert (a traced // exports as ONNX's
    # truncating Div: the ceiling by negation came out one row short, a negative padding)
    if rows * experts > routed:
        x = torch.cat([x, x.new_zeros(rows * experts - routed, x.shape[1])])
    y = compute(x.view(experts, rows, -1))
    return y.reshape(rows * experts, -1)[:routed]


def _linear(self: Any, x: Any, name: str) -> Any:
    """`x` [E, rows, in] through every expert's `name` weight ([E, out, in], or [E, in, out]
    where the module stores them transposed) and its bias: [E, rows, out]."""
    w = getattr(self, name)
    y = x @ (w if self.is_transposed else w.transpose(1, 2))
    if self.has_bias:
        y = y + getattr(self, f"{name}_bias")[:, None, :]
    return y


def _dbrx(self: Any, hidden: Any, top_k_index: Any, top_k_weights: Any) -> Any:
    """DBRX's experts (`DbrxExperts`: each expert's w1, v1, w2 rows of [E F, d] weights) on
    `hidden` [B, S, d], as balanced routing: [B, S, d]."""
    e, f, d = self.num_experts, self.ffn_hidden_size, self.hidden_size
    w1, v1, w2 = (getattr(self.mlp, n).view(e, f, d) for n in ("w1", "v1", "w2"))

    def compute(x: Any) -> Any:  # [E, rows, d]
        h = self.mlp.activation_fn(x @ w1.transpose(1, 2)) * (x @ v1.transpose(1, 2))
        return h @ w2  # [E, rows, F] @ [E, F, d]

    out = dispatched(hidden.reshape(-1, d), top_k_index, top_k_weights, e, compute)
    return out.view(hidden.shape[0], -1, d)


def _switch(self: Any, hidden: Any, selected: Any, weights: Any) -> Any:
    """Switch Transformers' experts (a module each) on `hidden` [T, d], each token's expert
    one-hot in `selected` [T, 1, E] with its weight [T, 1], as balanced routing: [T, d]."""
    return dispatched(hidden, selected.argmax(-1), weights, self.num_experts, _each(self))


def _top_two(self: Any, hidden: Any, selected: Any, gates: Any) -> Any:
    """NLLB-MoE's experts (a module each) on `hidden` [T, d], each token routed to the two
    experts its `gates` [T, E] weigh (zero elsewhere; `selected`, the first of them within
    capacity, is not read), as balanced routing: [T, d]."""
    weights, index = gates.topk(2, dim=-1)  # [T, 2]
    return dispatched(hidden, index, weights, self.num_experts, _each(self))


def _each(self: Any) -> Callable[[Any], Any]:
    """Each expert of `self` (a module dict of `expert_{i}`) on its rows: [E, rows, d] ->
    [E, rows, d]."""
    import torch

    return lambda x: torch.stack([self[f"expert_{i}"](x[i]) for i in range(self.num_experts)])


def _grouped(self: Any, inputs: Any, expert_size: Any) -> Any:
    """JetMoE's experts (`JetMoeParallelExperts`: weight [E, out, in]) on `inputs` [R, in],
    the routed rows sorted by expert, as balanced routing: an equal share each. [R, out]"""
    return _shared(inputs, self.num_experts, lambda x: x @ self.weight.transpose(1, 2))


def _top_k_gating(self: Any, hidden: Any) -> Any:
    """JetMoE's router (`JetMoeTopKGating`) on `hidden` [T, d], without the count of rows each
    expert gets (data, which `_grouped` takes as equal): the routed rows' order by expert,
    their tokens and weights [T k], and the logits [T, E]."""
    import torch

    logits = self.layer(hidden).float()  # [T, E]
    top, index = logits.topk(self.top_k, dim=1)  # [T, k]
    ROUTED.append(int(self.top_k))
    order = index.flatten().argsort()  # [T k]
    gates = torch.softmax(top, dim=1).type_as(hidden).flatten()[order]
    return order, torch.div(order, self.top_k, rounding_mode="trunc"), gates, None, logits


def _every_expert(self: Any, hidden: Any) -> tuple[Any, Any]:
    """Llama 4's mixture (`Llama4TextMoe`, whose forward runs every expert on every token, the
    router's scores zeroing all but the top k) on `hidden` [B, S, d], as balanced routing (what
    routed training code runs), its shared expert beside: [B S, d], and the logits [B S, E]."""
    import torch

    hidden = hidden.reshape(-1, self.hidden_dim)
    logits = torch.nn.Linear.forward(self.router, hidden)  # [T, E]
    top, index = torch.topk(logits, self.top_k, dim=1)  # [T, k]
    weights = torch.sigmoid(top.float()).to(hidden.dtype)
    d = self.hidden_dim
    routed = dispatched(hidden, index, weights, self.num_experts,
                        lambda x: self.experts(x.reshape(-1, d)).view(*x.shape[:2], d))
    return self.shared_expert(hidden) + routed, logits


def _by_modality(self: Any, hidden: Any, moe_mm_token_type_ids: Any = None) -> tuple[Any, Any]:
    """ERNIE 4.5 VL's mixture (`Ernie4_5_VLMoeMoeBlock`: experts of text and of images apart,
    each token's by a mask of the data) on `hidden` [B, S, d], a sample's image tokens its
    first n (`moe_mm_token_type_ids` [B, S], values on the CPU: `vision_language.placed` puts
    them first): the image experts on those, the text experts on the rest, the shared expert
    on every token. [B, S, d], the logits [B S, E]"""
    import torch

    b, _, d = hidden.shape
    n = 0 if moe_mm_token_type_ids is None else int(moe_mm_token_type_ids[0].sum())
    outs, logits = [], []
    for moe, x in ((self.vision_moe, hidden[:, :n]), (self.text_moe, hidden[:, n:])):
        if x.shape[1]:
            y, r = moe(x.contiguous())  # flattened: [b s d], [b s E]
            outs.append(y.view(b, -1, d))
            logits.append(r.view(b, -1, self.num_experts))
    out = torch.cat(outs, dim=1)
    if self.shared_experts is not None:
        out = out + self.shared_experts(hidden)
    return out, torch.cat(logits, dim=1).view(-1, self.num_experts)


# experts of transformers' models outside its experts interface, whose own forward sizes each
# expert's rows by the data (`nonzero`, `.tolist()`) or runs every expert on every token
# (`EVERY`): class name -> its balanced forward
ADAPTED = {"DbrxExperts": _dbrx, "SwitchTransformersExperts": _switch, "NllbMoeExperts": _top_two,
           "JetMoeParallelExperts": _grouped, "JetMoeTopKGating": _top_k_gating,
           "Llama4TextMoe": _every_expert, "Ernie4_5_VLMoeMoeBlock": _by_modality}
EVERY = ("Llama4TextMoe",)
# the modules holding a layer's experts, each
HOLDERS = ("DbrxExperts", "SwitchTransformersExperts", "NllbMoeExperts", "JetMoeMoE")


@contextlib.contextmanager
def adapted(model: Any) -> Iterator[None]:
    """`model` (a torch model) with the forward of every `ADAPTED` class it holds replaced by
    balanced routing, restored after."""
    classes = {type(m) for m in model.modules() if type(m).__name__ in ADAPTED}
    original = {c: c.forward for c in classes}
    for c in classes:
        c.forward = ADAPTED[c.__name__]
    try:
        yield
    finally:
        for c, forward in original.items():
            c.forward = forward


def describe(model: Any, experts: int, top_k: int) -> dict:
    """The mixture in `model` (built with `balanced`): its experts, each token's top k, the
    layers holding experts and the experts' parameters (their routers' apart)."""
    held = [m for m in model.modules() if type(m).__name__ in HOLDERS or (
        hasattr(m, "num_experts") and hasattr(m, "down_proj")
        and not hasattr(m.down_proj, "weight"))]  # the experts' stacked [E, out, in] weights
    every = {type(m).__name__ for m in model.modules() if type(m).__name__ in EVERY}
    return dict(experts=experts, top_k=top_k, layers=len(held),
                params=sum(p.numel() for m in held for name, p in m.named_parameters()
                           if not name.startswith("router") and name != "bias"),
                **({"every": every.pop()} if every else {}))


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
