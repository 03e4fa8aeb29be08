"""MDOT: multi-dimensional operator encoding + graph positional encoding + sequence Transformer.

Shapes: B batch, T operators (padded), D model width, H heads, K workloads per sequence.
Dropout randomness comes in explicitly as `rng` (pure calls).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from mdot_jax.data.features import FAR, MAX_DEPTH, Batch
from mdot_jax.models.config import ModelConfig
from mdot_jax.models.layers import (
    Block,
    Mlp,
    OperatorEncoder,
    masked_pool,
    per_op_log_times,
    with_workloads,
)


def sinusoidal(positions, d: int):
    """`[..., T] -> [..., T, d]` transformer sinusoids of integer positions."""
    freqs = jnp.exp(-jnp.log(10000.0) * jnp.arange(0, d, 2) / d)  # [d/2]
    angles = positions[..., None] * freqs
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


class GraphPE(nnx.Module):
    """Adds the configured graph positional encodings to `[B, T, D]`; returns the attention
    bias `[B, H, T, T]` (or None) from graph distances."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d = cfg.d_model
        self.kinds, self.lap_dim, self.attn_block = cfg.pe, cfg.lap_dim, cfg.attn_block
        if "depth" in cfg.pe:
            self.depth_emb = nnx.Embed(MAX_DEPTH + 1, d, rngs=rngs)
            self.rdepth_emb = nnx.Embed(MAX_DEPTH + 1, d, rngs=rngs)
        if "laplacian" in cfg.pe:
            self.lap = nnx.Linear(cfg.lap_dim, d, rngs=rngs)
        if "random_walk" in cfg.pe:
            self.rw = nnx.Linear(cfg.rw_dim, d, rngs=rngs)
        if "distance_bias" in cfg.pe:
            self.dist_bias = nnx.Embed(FAR + 1, cfg.n_heads, rngs=rngs)

    def __call__(self, x, batch: Batch, *, train: bool, rng):
        B, T, D = x.shape
        if "sinusoidal" in self.kinds:
            x = x + sinusoidal(jnp.arange(T, dtype=jnp.float32), D)[None]
        if "depth" in self.kinds:
            x = x + self.depth_emb(batch.depth[..., 0]) + self.rdepth_emb(batch.depth[..., 1])
        if "laplacian" in self.kinds:
            lap = batch.pe[..., :self.lap_dim]  # [B, T, k]
            if train:  # eigenvector signs are arbitrary: flip at random while training
                signs = jax.random.rademacher(rng, (B, 1, self.lap_dim)).astype(lap.dtype)
                lap = lap * signs
            x = x + self.lap(lap)
        if "random_walk" in self.kinds:
            x = x + self.rw(batch.pe[..., self.lap_dim:])
        bias = None
        if "distance_bias" in self.kinds:
            dist = batch.dist.astype(jnp.int32)  # [B, T, T]
            S = self.attn_block
            if S and T > S:  # only the diagonal blocks: [B, N, S, S]
                N = T // S
                dist = dist.reshape(B, N, S, N, S)[:, jnp.arange(N), :, jnp.arange(N)]
                dist = dist.transpose(1, 0, 2, 3)
                bias = self.dist_bias(dist).transpose(0, 1, 4, 2, 3)  # [B, N, H, S, S]
            else:
                bias = self.dist_bias(dist).transpose(0, 3, 1, 2)  # [B, H, T, T]
        return x, bias


class MDOT(nnx.Module):
    """Batch -> normalised log iteration time `[B, K]` (and per-operator scores `[B, K, T]`)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d = cfg.d_model
        self.cfg = cfg
        self.encoder = OperatorEncoder(cfg, rngs=rngs)
        self.pe = GraphPE(cfg, rngs=rngs)
        self.blocks = nnx.List([Block(d, cfg.n_heads, cfg.mlp_ratio, cfg.dropout,
                                      block=cfg.attn_block, rngs=rngs)
                                for _ in range(cfg.n_layers)])
        self.ln = nnx.LayerNorm(d, rngs=rngs)
        self.workload = Mlp(cfg.workload_dim, 2 * d, d, rngs=rngs)
        self.head = Mlp(3 * d, 2 * d, 1, rngs=rngs)
        if cfg.readout == "per_op":
            self.op_head = Mlp(2 * d, d, 1, rngs=rngs)

    def __call__(self, batch: Batch, *, train: bool = False, rng=None):
        """Returns `(prediction [B, K], per-operator log-time scores [B, K, T])`."""
        rng = jax.random.key(0) if rng is None else rng
        r_pe, r_blocks = jax.random.split(rng)
        mask = batch.mask  # [B, T]
        x = self.encoder(batch)  # [B, T, D]
        x, bias = self.pe(x, batch, train=train, rng=r_pe)
        for i, block in enumerate(self.blocks):
            x = block(x, mask, bias, train=train, rng=jax.random.fold_in(r_blocks, i))
        x = self.ln(x) * mask[..., None]  # [B, T, D]
        w = self.workload(batch.workload)  # [B, K, D]
        pooled = with_workloads(masked_pool(x, mask), w)  # [B, K, 3D]
        B, K, T = w.shape[0], w.shape[1], x.shape[1]
        if self.cfg.readout == "per_op":
            per_op, total = per_op_log_times(self.op_head, x, w, mask)
            return total + self.head(pooled)[..., 0], per_op
        return self.head(pooled)[..., 0], jnp.zeros((B, K, T), x.dtype)
