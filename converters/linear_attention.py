"""A gated delta rule (the linear attention of Qwen3-Next, Qwen3.5, OLMo-hybrid) exported as the
chunked kernels training runs, not as transformers' reference loop; Kimi Linear's, decaying
each key channel (`chunk_kimi_delta_attention`), too (`per_channel`).

transformers computes it with flash-linear-attention's `chunk_gated_delta_rule` where that is
installed (what training runs) and otherwise with `torch_chunk_gated_delta_rule`, a Python loop
over 64-token chunks around a triangular solve that ONNX cannot export; traced, the loop would be
a graph growing with the sequence, priced as thousands of tiny kernels. Exported in its place,
`chunked` does the work of flash-linear-attention's kernels in one pass over all the chunks:
per (batch, head) and chunk of C tokens, dk / dv the key / value widths,

    A = (k beta) k^T, q k^T, both masked by the decays          2 x 2 C^2 dk FLOPs
    w = A (k beta e^g), u = A (v beta)                           2 C^2 (dk + dv)
    the state's update k^T u and its reads w h, q h              3 x 2 C dk dv
    the output (q k^T) (u - w h)                                 2 C^2 dv

with the states h [dk, dv] of every chunk kept (the backward reads them). Its values are not
the rule's: the states are summed over the chunks before (the scan's work and the tensors it
writes), where the rule feeds each one back through the chunk's keys; the triangular solve of
A (C^3 / 3 FLOPs a chunk, on chip) is one pass over it. Shapes, FLOPs and the bytes each step
reads and writes are the kernels'.
"""

from __future__ import annotations

from typing import Any

FUNCTION = "torch_chunk_gated_delta_rule"  # transformers' name, in each model's module
PER_CHANNEL = "chunk_kimi_delta_attention"  # Kimi Linear's (its reference loop, without fla)
CHUNK = 64  # flash-linear-attention's chunk


def chunked(query: Any, key: Any, value: Any, g: Any, beta: Any, chunk_size: int = CHUNK,
            initial_state: Any = None, output_final_state: bool = False,
            use_qk_l2norm_in_kernel: bool = False, **kwargs: Any) -> tuple[Any, Any]:
    """The rule's work on `query`, `key` [B, T, Hk, dk], `value` [B, T, H, dv], the decays `g`
    (log space) and `beta` [B, T, H]: the output [B, T, H, dv] and, asked, the last state
    [B, H, dk, dv] (`initial_state` added to every chunk's)."""
    import torch
    import torch.nn.functional as F

    t, hk, dk = key.shape[1:]
    h, dv = value.shape[-2:]
    if h != hk:  # grouped values: each query / key head serves h // hk value heads
        query, key = (x.repeat_interleave(h // hk, dim=2) for x in (query, key))
    if use_qk_l2norm_in_kernel:
        query, key = (F.normalize(x, dim=-1, eps=1e-6) for x in (query, key))
    c = chunk_size
    pad = -t % c
    n = (t + pad) // c

    def chunks(x: Any) -> Any:  # [B, T, H, ...] -> [B, H, N, C, ...]
        x = x.transpose(1, 2)
        x = F.pad(x, (0, 0, 0, pad) if x.dim() == 4 else (0, pad))
        return x.reshape(-1, h, n, c, *x.shape[3:])  # -1: the batch, dynamic in the graph

    q, k, v = chunks(query * dk ** -0.5), chunks(key), chunks(value)  # [B, H, N, C, d]
    gates = chunks(g).cumsum(-1)  # [B, H, N, C] log decay since the chunk's start
    beta = chunks(beta).unsqueeze(-1)  # [B, H, N, C, 1]
    causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    decay = (gates.unsqueeze(-1) - gates.unsqueeze(-2)).masked_fill(~causal, float("-inf")).exp()
    kb = k * beta
    a = -((kb @ k.transpose(-1, -2)) * decay).tril(-1)  # [B, H, N, C, C] the system to solve
    w = a @ (kb * gates.exp().unsqueeze(-1))  # [B, H, N, C, dk]
    u = a @ (v * beta)  # [B, H, N, C, dv]
    kd = k * (gates[..., -1:] - gates).exp().unsqueeze(-1)  # keys decayed to the chunk's end
    step = kd.transpose(-1, -2) @ u  # [B, H, N, dk, dv] each chunk's update of the state
    state = step.cumsum(2) - step  # [B, H, N, dk, dv] the state entering each chunk
    if initial_state is not None:
        state = state + initial_state.unsqueeze(2).to(state.dtype)
    v_new = u - w @ state  # [B, H, N, C, dv]
    out = (q * gates.exp().unsqueeze(-1)) @ state + ((q @ k.transpose(-1, -2)) * decay) @ v_new
    out = out.reshape(-1, h, n * c, dv)[:, :, :t].transpose(1, 2).contiguous()  # [B, T, H, dv]
    last = (state[:, :, -1] + step[:, :, -1]) if output_final_state else None
    return out.to(value.dtype), last


def per_channel(query: Any, key: Any, value: Any, g: Any, beta: Any, chunk_size: int = CHUNK,
                initial_state: Any = None, output_final_state: bool = False,
                use_qk_l2norm_in_kernel: bool = False, **kwargs: Any) -> tuple[Any, Any]:
    """Kimi delta attention: the rule with a decay per key channel, `g` [B, T, H, dk].
    flash-linear-attention's `chunk_kda` folds each channel's decay into the queries and keys
    its matmuls read; here they are applied to them (elementwise over [B, T, H, dk]) and the
    rule's chunks (`chunked`) run on the channels' mean decay: the same matmuls, shapes and
    outputs."""
    import torch.nn.functional as F

    if use_qk_l2norm_in_kernel:
        query, key = (F.normalize(x, dim=-1, eps=1e-6) for x in (query, key))
    decay = g.exp()  # [B, T, H, dk]
    return chunked(query * decay, key * decay, value, g.mean(-1), beta, chunk_size,
                   initial_state, output_final_state)
