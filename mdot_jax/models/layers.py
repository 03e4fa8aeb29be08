"""Layers shared by the networks. Shapes: B batch, T operators (padded), D width, H heads,
K workloads per sequence, E workload embedding width."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from mdot_jax.data.features import Batch
from mdot_jax.models.config import ModelConfig

SMALL_T = 4  # attention over at most this many tokens uses broadcasting, not matmuls


class Mlp(nnx.Module):
    def __init__(self, d_in: int, d_hidden: int, d_out: int, *, rngs: nnx.Rngs):
        self.fc1 = nnx.Linear(d_in, d_hidden, rngs=rngs)
        self.fc2 = nnx.Linear(d_hidden, d_out, rngs=rngs)

    def __call__(self, x):  # [..., d_in] -> [..., d_out]
        return self.fc2(jax.nn.gelu(self.fc1(x)))


class Attention(nnx.Module):
    """Multi-head self-attention with a key mask and an optional additive bias.

    Sequences longer than `block` attend within blocks of `block` operators plus one summary
    key/value per block (the masked mean of the block's keys and values), so the cost grows
    as T * (block + T / block) instead of T^2; shorter ones use full attention. `bias` is
    `[B, H, T, T]` for full attention and `[B, T/block, H, block, block]` for blocks.
    """

    def __init__(self, d: int, heads: int, *, block: int = 0, rngs: nnx.Rngs):
        assert d % heads == 0
        self.heads, self.block = heads, block
        self.qkv = nnx.Linear(d, 3 * d, rngs=rngs)
        self.out = nnx.Linear(d, d, rngs=rngs)

    def __call__(self, x, key_mask, bias=None):
        B, T, D = x.shape  # [B, T, D]
        H = self.heads
        q, k, v = jnp.split(self.qkv(x).reshape(B, T, 3, H, D // H), 3, axis=2)
        q, k, v = q[:, :, 0] / jnp.sqrt(D // H), k[:, :, 0], v[:, :, 0]  # [B, T, H, Dh]
        if T <= SMALL_T:  # a few tokens (operator fusion): broadcasting beats tiny matmuls
            logits = (q[:, :, None] * k[:, None, :]).sum(-1).transpose(0, 3, 1, 2)
        elif not self.block or T <= self.block:
            logits = jnp.einsum("bqhd,bkhd->bhqk", q, k)  # [B, H, T, T]
        else:
            y = self._blocked(q, k, v, key_mask, bias)
            return self.out(y.reshape(B, T, D))
        if bias is not None:
            logits = logits + bias
        logits = jnp.where(key_mask[:, None, None, :], logits, -1e9)
        attn = jax.nn.softmax(logits, axis=-1)
        if T <= SMALL_T:
            y = (attn.transpose(0, 2, 3, 1)[..., None] * v[:, None]).sum(2)  # [B, T, H, Dh]
        else:
            y = jnp.einsum("bhqk,bkhd->bqhd", attn, v)
        return self.out(y.reshape(B, T, D))

    def _blocked(self, q, k, v, key_mask, bias):
        B, T, H, Dh = q.shape
        S = self.block
        N = T // S  # bucket lengths are powers of two, so S divides T
        q, k, v = (a.reshape(B, N, S, H, Dh) for a in (q, k, v))  # [B, N, S, H, Dh]
        m = key_mask.reshape(B, N, S)
        count = jnp.maximum(m.sum(-1), 1)[..., None, None]  # [B, N, 1, 1]
        k_sum = (k * m[..., None, None]).sum(2) / count  # [B, N, H, Dh]
        v_sum = (v * m[..., None, None]).sum(2) / count
        local = jnp.einsum("bnqhd,bnkhd->bnhqk", q, k)  # [B, N, H, S, S]
        if bias is not None:
            local = local + bias
        local = jnp.where(m[:, :, None, None, :], local, -1e9)
        glob = jnp.einsum("bnqhd,bmhd->bnhqm", q, k_sum)  # [B, N, H, S, N]
        glob = jnp.where(m.any(-1)[:, None, None, None, :], glob, -1e9)
        attn = jax.nn.softmax(jnp.concatenate([local, glob], -1), axis=-1)
        y = (jnp.einsum("bnhqk,bnkhd->bnqhd", attn[..., :S], v)
             + jnp.einsum("bnhqm,bmhd->bnqhd", attn[..., S:], v_sum))  # [B, N, S, H, Dh]
        return y.reshape(B, T, H * Dh)


class Block(nnx.Module):
    """Pre-LN Transformer block."""

    def __init__(self, d: int, heads: int, mlp_ratio: int, dropout: float, *, block: int = 0,
                 rngs: nnx.Rngs):
        self.ln1 = nnx.LayerNorm(d, rngs=rngs)
        self.attn = Attention(d, heads, block=block, rngs=rngs)
        self.ln2 = nnx.LayerNorm(d, rngs=rngs)
        self.mlp = Mlp(d, mlp_ratio * d, d, rngs=rngs)
        self.drop = nnx.Dropout(dropout)

    def __call__(self, x, key_mask, bias, *, train: bool, rng):
        r1, r2 = jax.random.split(rng)
        x = x + self.drop(self.attn(self.ln1(x), key_mask, bias), deterministic=not train,
                          rngs=r1)
        return x + self.drop(self.mlp(self.ln2(x)), deterministic=not train, rngs=r2)


class OperatorEncoder(nnx.Module):
    """Type, configuration and load of each operator -> one embedding `[B, T, D]`.

    `transformer` fusion: the three are tokens of a 3-token Transformer block run per
    operator, mean-pooled; `concat` fusion (ablation): an MLP over their concatenation.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d = cfg.d_model
        self.fusion = cfg.fusion
        self.type_emb = nnx.Embed(cfg.vocab_size, d, rngs=rngs)
        self.config_mlp = Mlp(cfg.config_dim, 2 * d, d, rngs=rngs)
        self.load_mlp = Mlp(cfg.load_dim, 2 * d, d, rngs=rngs)
        if cfg.fusion == "transformer":
            self.slot = nnx.Param(jax.random.normal(rngs.params(), (3, d)) * 0.02)
            self.block = Block(d, cfg.n_heads, cfg.mlp_ratio, 0.0, rngs=rngs)
        else:
            self.mix = Mlp(3 * d, 2 * d, d, rngs=rngs)

    def __call__(self, batch: Batch):
        tokens = jnp.stack([self.type_emb(batch.op_type), self.config_mlp(batch.config),
                            self.load_mlp(batch.load)], axis=2)  # [B, T, 3, D]
        B, T, _, D = tokens.shape
        if self.fusion == "concat":
            return self.mix(tokens.reshape(B, T, 3 * D))
        flat = (tokens + self.slot[...]).reshape(B * T, 3, D)  # [B*T, 3, D]
        ones = jnp.ones((B * T, 3), bool)
        fused = self.block(flat, ones, None, train=False, rng=jax.random.key(0))
        return fused.mean(axis=1).reshape(B, T, D)


def with_workloads(seq_vec, w):
    """`[B, F]` sequence summary + `[B, K, E]` workload embeddings -> `[B, K, F + E]`."""
    return jnp.concatenate([jnp.broadcast_to(seq_vec[:, None], w.shape[:2] + seq_vec.shape[1:]),
                            w], -1)


def per_op_log_times(op_head, x, w, mask):
    """Per-operator log times `[B, K, T]` from operator states `[B, T, D]` and workload
    embeddings `[B, K, E]`, and the log of their sum `[B, K]` (padding excluded)."""
    xb = jnp.broadcast_to(x[:, None], w.shape[:2] + x.shape[1:])  # [B, K, T, D]
    wb = jnp.broadcast_to(w[:, :, None], xb.shape[:3] + w.shape[-1:])
    per_op = op_head(jnp.concatenate([xb, wb], -1))[..., 0]
    per_op = jnp.where(mask[:, None], per_op, -1e9)
    return per_op, jax.nn.logsumexp(per_op, axis=-1)




def masked_pool(x, mask):
    """Masked mean and max over operators: `[B, T, D] -> [B, 2D]` (0 for an empty row)."""
    count = jnp.maximum(mask.sum(axis=1, keepdims=True), 1)  # [B, 1]
    mean = (x * mask[..., None]).sum(axis=1) / count
    mx = jnp.where(mask[..., None], x, -1e9).max(axis=1)
    return jnp.concatenate([mean, jnp.where(mask.any(axis=1, keepdims=True), mx, 0.0)], -1)


def no_scores(w, mask):
    """Per-operator scores of a network that has none: zeros `[B, K, T]`."""
    return jnp.zeros(w.shape[:2] + mask.shape[1:])
