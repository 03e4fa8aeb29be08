"""Mamba-2's state space layers (Mamba-2, and the hybrids Nemotron-H, Granite-4.0-H, Bamba,
Falcon-H1, Zamba2) exported as the fused kernels training runs, not as transformers' fallback.

In training, transformers hands a Mamba-2 mixer's projected input to mamba_ssm's
`mamba_split_conv1d_scan_combined` where that is installed (what training runs: the causal
conv1d, the chunked scan of the state space dual, the gated RMSNorm and the output projection
in a few fused kernels) and otherwise computes it in eager PyTorch: about 120 kernels a layer, in
fp32, with B and C copied to every head and C B^T computed once a head instead of once a group.
Exported in its place, `combined` does what the fused kernels do, exactly (the same output), in
one pass over the chunks: per chunk of Q tokens, N the state width, P a head's width,

    C B^T, once a group (the heads of a group share it)          2 Q^2 N
    the causal decays applied, then (C B^T L) (x dt), a head     2 Q^2 P
    the chunk's state B^T (x dt decay), a head                   2 Q N P
    the states passed between chunks (a lower-triangular product over the chunks, small)
    the output's read of the entering state C h, a head          2 Q N P

then the skip D x, y silu(z) normalised per group, and the output projection.
"""

from __future__ import annotations

import math
from typing import Any

FUNCTION = "mamba2_split_conv1d_scan_combined"  # transformers' name, in each model's module


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
    import torch
    import torch.nn.functional as F

    if initial_states is not None or return_final_states or activation not in ("silu", "swish") \
            or not headdim:
        return None
    h, (conv_dim, width), p = dt_bias.shape[0], conv1d_weight.shape, headdim
    dim = h * p
    g, r = ngroups, h // ngroups  # groups of B and C, the heads each serves
    n = (conv_dim - dim) // (2 * g)
    t = zxbcdt.shape[1]
    z, xbc, dt = zxbcdt[..., -(dim + conv_dim + h):].split([dim, conv_dim, h], dim=-1)
    xbc = F.silu(F.conv1d(xbc.transpose(1, 2), conv1d_weight.unsqueeze(1), conv1d_bias,
                          padding=width - 1, groups=conv_dim)[..., :t].transpose(1, 2))
    x, b, c = xbc.split([dim, g * n, g * n], dim=-1)
    dt = F.softplus(dt + dt_bias)  # [B, T, H]
    if dt_limit != (0.0, math.inf):
        dt = dt.clamp(*dt_limit)
    q = chunk_size
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
    y = (y + x.unflatten(-1, (h, p)) * D.reshape(h, -1)).flatten(-2)  # the skip D x
    if rmsnorm_weight is not None:  # gated RMSNorm per group (norm_before_gate: gate after)
        if not norm_before_gate:
            y = y * F.silu(z)
        grouped = y.unflatten(-1, (g, dim // g))
        y = (grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + rmsnorm_eps)
             ).flatten(-2) * rmsnorm_weight
        if norm_before_gate:
            y = y * F.silu(z)
    else:
        y = y * F.silu(z)
    return F.linear(y.to(zxbcdt.dtype), outproj_weight, outproj_bias)
