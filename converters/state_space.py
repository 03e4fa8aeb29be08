"""Mamba's state space layers exported as the fused kernels training runs, not as transformers'
fallback: Mamba-2's (Mamba-2, and the hybrids Nemotron-H, Granite-4.0-H, Bamba, Falcon-H1,
Zamba2) and Mamba-1's selective scan (Mamba, Falcon-Mamba, Jamba, Zamba).

In training, transformers hands a Mamba-2 mixer's projected input to mamba_ssm's
`mamba_split_conv1d_scan_combined` where that is installed (what training runs: the causal
conv1d, the chunked scan of the state space dual, the gated RMSNorm and the output projection
in a few fused kernels) and otherwise computes it in eager PyTorch: about 120 kernels a layer, in
fp32, with B and C copied to every head and C B^T computed once a head instead of once a group.
Exported in its place, `combined` does what the fused kernels do, exactly (the same output),
each fused kernel one node of the `mdot` domain whose output is shaped as its first input: the
causal conv1d and its silu, `CausalConv1d` (x [B, T, C], the weight [C, W], the bias), and the
gated RMSNorm, `GatedRMSNorm` (y, z, the weight; eps, groups, norm_before_gate), each one pass
over its tensors; the splits of the projected input are views they read; the chunked scan,
`ChunkScan` (x, dt, A, B, C, D) whose intermediates stay on chip, as fused attention's do, and
whose FLOPs are, per chunk of Q tokens, N the state width, P a head's width,

    C B^T, once a group (the heads of a group share it)          2 Q^2 N
    the causal decays applied, then (C B^T L) (x dt), a head     2 Q^2 P
    the chunk's state B^T (x dt decay), a head                   2 Q N P
    the states passed between chunks (a lower-triangular product over the chunks, small)
    the output's read of the entering state C h, a head          2 Q N P

then the skip D x (in the node); then the gated norm and the output projection. Traced on a
CPU, the nodes compute exactly (`_conv`, `_chunked`, `_gated_norm`, not exported).

Mamba-1's selective scan (`mamba_selective_scan`, mamba_ssm's `selective_scan_fn` where
installed) runs in training as one kernel that keeps the [channels, state] recurrence on chip;
transformers' fallback loops over the tokens (the exporter unrolls it, one set of operators a
token). Exported in its place, `selective_scan` is one node, `SelectiveScan` in the `mdot`
domain, of the kernel's inputs and output (u, dt [B, D, L], A [D, N], B, C [B, N, L], the skip
D, the gate z, dt's bias; out [B, D, L]): its FLOPs are the 9 B L D N a scan takes (mamba_ssm's
count) and its bytes what the kernel reads and writes. Traced on a CPU, it computes the scan
exactly (a loop over the tokens, not exported). Shape inference knows no schema of it: the loader
defines it as a model-local function that passes its first input through (`define_own_ops`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

FUNCTION = "mamba2_split_conv1d_scan_combined"  # transformers' name, in each model's module
SCAN = "mamba_selective_scan"  # Mamba-1's, in each of its models' modules
DOMAIN, SCAN_OP = "mdot", "SelectiveScan"  # the node `selective_scan` exports
CHUNK_OP = "ChunkScan"  # the node of Mamba-2's chunked scan (`combined`)
CONV_OP, NORM_OP = "CausalConv1d", "GatedRMSNorm"  # its causal conv1d and gated norm
OWN_OPS = (SCAN_OP, CHUNK_OP, CONV_OP, NORM_OP)


def _same_shape(inputs: list[str]) -> list[Any]:
    """A node whose output is its first input's shape, for inference: that input passed on."""
    from onnx import helper

    return [helper.make_node("Identity", [inputs[0]], ["y"])]


# our nodes' bodies for shape inference, from their inputs' names (`converters.ctc` adds its)
OWN_SHAPES: dict[tuple[str, str], Callable[[list[str]], list[Any]]] = {
    (DOMAIN, op): _same_shape for op in OWN_OPS}


def define_own_ops(model: Any) -> None:
    """Defines our exporter's own nodes in the ONNX `model` (`OWN_SHAPES`) as model-local
    functions of their output's shape, so that shape inference carries shapes past them."""
    from onnx import helper

    defined = {(f.domain, f.name) for f in model.functions}
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
    for node in model.graph.node:
        key = (node.domain, node.op_type)
        if key in OWN_SHAPES and key not in defined:
            inputs = [f"x{k}" for k in range(len(node.input))]
            model.functions.append(helper.make_function(
                node.domain, node.op_type, inputs, ["y"], OWN_SHAPES[key](inputs),
                [helper.make_opsetid("", opset)], [a.name for a in node.attribute]))
            defined.add(key)
            if all(o.domain != node.domain for o in model.opset_import):
                model.opset_import.append(helper.make_opsetid(node.domain, 1))


def heads_and_groups(module: Any) -> dict | None:
    """The state space heads and groups of B and C of a model's Mamba-2 mixers (what tensor
    parallelism must divide), None where it has none."""
    mixers = [m for m in module.modules() if hasattr(m, "dt_bias") and hasattr(m, "n_groups")]
    return dict(heads=int(mixers[0].dt_bias.shape[0]), groups=int(mixers[0].n_groups)) \
        if mixers else None


def combined(zxbcdt: Any, conv1d_weight: Any, conv1d_bias: Any, dt_bias: Any, A: Any, D: Any,
             chunk_size: int, initial_states: Any = None,
             dt_limit: tuple[float, float] = (0.0, math.inf), return_final_states: bool = False,
             activation: str = "silu", rmsnorm_weight: Any = None, rmsnorm_eps: float = 1e-6,
             outproj_weight: Any = None, outproj_bias: Any = None, headdim: int | None = None,
             ngroups: int = 1, norm_before_gate: bool = True, **kwargs: Any) -> Any:
    """A Mamba-2 mixer's output [B, T, d] from its projected input `zxbcdt` [B, T, z | x B C |
    dt], as mamba_ssm's fused kernels compute it; None (the caller's own path) for what
    training does not ask: a carried state, the final state, another activation, no head
    width."""
    import torch.nn.functional as F

    if initial_states is not None or return_final_states or activation not in ("silu", "swish") \
            or not headdim:
        return None
    h, conv_dim, p = dt_bias.shape[0], conv1d_weight.shape[0], headdim
    dim = h * p
    g = ngroups  # groups of B and C
    n = (conv_dim - dim) // (2 * g)
    if zxbcdt.shape[-1] != dim + conv_dim + h:  # an MLP's share first (mamba_ssm's d_mlp)
        zxbcdt = zxbcdt[..., -(dim + conv_dim + h):]
    z, xbc, dt = zxbcdt.split([dim, conv_dim, h], dim=-1)
    bias = conv1d_bias if conv1d_bias is not None else conv1d_weight.new_zeros(conv_dim)
    xbc = _node(CONV_OP).apply(xbc, conv1d_weight, bias)  # [B, T, conv_dim], silu'd
    x, b, c = xbc.split([dim, g * n, g * n], dim=-1)
    dt = F.softplus(dt + dt_bias)  # [B, T, H]
    if dt_limit != (0.0, math.inf):
        dt = dt.clamp(*dt_limit)
    y = _node(CHUNK_OP).apply(x, dt, A, b, c, D, chunk_size, g)  # [B, T, H P]
    if rmsnorm_weight is not None:  # gated RMSNorm per group (norm_before_gate: gate after)
        y = _node(NORM_OP).apply(y, z, rmsnorm_weight, rmsnorm_eps, g, norm_before_gate)
    else:
        y = y * F.silu(z)
    return F.linear(y.to(zxbcdt.dtype), outproj_weight, outproj_bias)


def _conv(x: Any, weight: Any, bias: Any) -> Any:
    """causal_conv1d's work, silu'd: each channel of x [B, T, C] convolved with its `weight`
    [C, W] over the W tokens up to and including each one (none before the first)."""
    import torch.nn.functional as F

    t, (c, w) = x.shape[1], weight.shape
    return F.silu(F.conv1d(x.transpose(1, 2), weight.unsqueeze(1), bias, padding=w - 1,
                           groups=c)[..., :t].transpose(1, 2))


def _gated_norm(y: Any, z: Any, weight: Any, eps: float, g: int, norm_before_gate: bool) -> Any:
    """The gated RMSNorm of y [B, T, D] over `g` groups of its features, gated by silu(z)
    before it or (`norm_before_gate`) after it, scaled by `weight` [D]."""
    import torch
    import torch.nn.functional as F

    if not norm_before_gate:
        y = y * F.silu(z)
    grouped = y.unflatten(-1, (g, y.shape[-1] // g))
    y = (grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + eps)).flatten(-2) * weight
    return y * F.silu(z) if norm_before_gate else y


def _chunked(x: Any, dt: Any, A: Any, b: Any, c: Any, D: Any, q: int,  # noqa: N803
             g: int) -> Any:
    """The chunked scan of the state space dual and the skip D x: y [B, T, H P] from x [B, T,
    H P], dt [B, T, H] (after its softplus), A, D [H], b, c [B, T, G N], in chunks of `q`
    tokens, C B^T once a group (module docstring)."""
    import torch
    import torch.nn.functional as F

    t, h = x.shape[1], dt.shape[-1]
    r, p, n = h // g, x.shape[-1] // h, b.shape[-1] // g
    pad = -t % q
    nc = (t + pad) // q

    def chunks(y: Any, heads: int) -> Any:  # [B, T, heads * w] -> [B, G, heads/G, nc, Q, w]
        y = F.pad(y, (0, 0, 0, pad)) if pad else y
        y = y.reshape(-1, nc, q, g, heads // g, y.shape[-1] // heads)
        return y.permute(0, 3, 4, 1, 2, 5)

    xs, bs, cs = chunks(x, h), chunks(b, g), chunks(c, g)  # [B, G, R|1, nc, Q, P|N]
    dts = chunks(dt, h)[..., 0]  # [B, G, R, nc, Q]
    decay = (dts * A.reshape(g, r, 1, 1)).cumsum(-1)  # log decay since the chunk's start
    causal = torch.ones(q, q, dtype=torch.bool, device=x.device).tril()
    inside = (decay.unsqueeze(-1) - decay.unsqueeze(-2)).masked_fill(~causal, -math.inf).exp()
    xdt = xs * dts.unsqueeze(-1)  # [B, G, R, nc, Q, P]
    y = ((cs @ bs.transpose(-1, -2)) * inside) @ xdt  # C B^T once a group; [B, G, R, nc, Q, P]
    last = decay[..., -1:]  # [B, G, R, nc, 1] each chunk's whole decay
    states = (xdt * (last - decay).exp().unsqueeze(-1)).transpose(-1, -2) @ bs  # [.., nc, P, N]
    ends = last[..., 0].cumsum(-1)  # [B, G, R, nc] decay from the start to each chunk's end
    between = ((ends - last[..., 0]).unsqueeze(-1) - ends.unsqueeze(-2)).masked_fill(
        ~torch.ones(nc, nc, dtype=torch.bool, device=x.device).tril(-1), -math.inf).exp()
    entering = (between @ states.flatten(-2)).unflatten(-1, (p, n))  # [B, G, R, nc, P, N]
    y = y + (cs @ entering.transpose(-1, -2)) * decay.exp().unsqueeze(-1)
    y = y.permute(0, 3, 4, 1, 2, 5).reshape(-1, nc * q, h, p)  # [B, T (padded), H, P]
    y = y[:, :t] if pad else y
    return (y + x.unflatten(-1, (h, p)) * D.reshape(h, -1)).flatten(-2)  # the skip D x


def selective_scan(hidden_states: Any, dt: Any, A: Any, B: Any, C: Any, D: Any = None,
                   z: Any = None, delta_bias: Any = None, delta_softplus: bool = False,
                   return_last_state: bool = False, **kwargs: Any) -> Any:
    """Mamba-1's selective scan [B, D, L] of `hidden_states` [B, D, L] (transformers'
    `mamba_selective_scan`'s arguments), exported as one `SelectiveScan` node (module
    docstring); with `return_last_state` (a cache, not training), also the last state."""
    import torch

    zero = torch.zeros(A.shape[0], dtype=A.dtype, device=A.device)
    args = (hidden_states, dt, A, B, C, zero if D is None else D,
            hidden_states if z is None else z, zero if delta_bias is None else delta_bias,
            bool(delta_softplus), z is not None)
    if return_last_state:
        return _scan(*args, last=True)
    return _node(SCAN_OP).apply(*args)


def _scan(u: Any, dt: Any, A: Any, B: Any, C: Any, D: Any, z: Any, bias: Any,  # noqa: N803
          softplus: bool, gated: bool, last: bool = False) -> Any:
    """The selective scan, token by token, as transformers' fallback computes it."""
    import torch
    import torch.nn.functional as F

    dt = dt + bias[:, None]
    dt = F.softplus(dt) if softplus else dt
    decay = torch.exp(A[None, :, None, :] * dt[..., None])  # [B, D, L, N]
    drive = (dt * u)[..., None] * B.transpose(1, 2)[:, None]  # [B, D, L, N]
    state = u.new_zeros(u.shape[0], u.shape[1], A.shape[1])  # [B, D, N]
    ys = []
    for t in range(u.shape[-1]):
        state = decay[:, :, t] * state + drive[:, :, t]
        ys.append((state * C[:, None, :, t]).sum(-1))
    y = torch.stack(ys, -1) + u * D[:, None]
    y = y * F.silu(z) if gated else y
    return (y, state) if last else y


@functools.cache
def _node(op: str) -> Any:
    """The autograd Function whose trace is one `op` node of our domain (`OWN_SHAPES`): its
    tensors, then the arguments `_NODES` names as the node's attributes (a float's a float,
    else an integer); traced on the meta device, an empty tensor shaped as its first input,
    else `_NODES`' computation (torch imported late)."""
    import torch

    compute, names = _NODES[op]

    class Node(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            return torch.empty_like(args[0]) if args[0].is_meta else compute(*args)

        @staticmethod
        def symbolic(graph, *args):
            k = len(args) - len(names)
            return graph.op(f"{DOMAIN}::{op}", *args[:k], **{
                f"{name}_f" if isinstance(v, float) else f"{name}_i":
                    v if isinstance(v, float) else int(v)
                for name, v in zip(names, args[k:])}).setType(args[0].type())

    return Node


# our nodes: the exact computation on a CPU, the trailing arguments that are attributes
_NODES = {SCAN_OP: (_scan, ("softplus", "gated")), CHUNK_OP: (_chunked, ("chunk", "groups")),
          CONV_OP: (_conv, ()), NORM_OP: (_gated_norm, ("eps", "groups", "norm_before_gate"))}
