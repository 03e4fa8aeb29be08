"""MDOT: multi-dimensional operator encoding + graph positional encoding + sequence Transformer.

Shapes: B batch, T operators (padded), D model width, H heads, C config, L load, P positional
features, W workload. Dropout randomness comes in explicitly as `rng` (pure calls).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from converters.vocab import VOCAB
from mdot_jax.features import CONFIG_DIM, FAR, LOAD_DIM, MAX_DEPTH, Batch

SMALL_T = 4  # attention over at most this many tokens uses broadcasting, not matmuls
PE_KINDS = ("none", "sinusoidal", "depth", "laplacian", "random_walk", "distance_bias")
# The paper's graph positional encoding, and the `mdot` row of the evaluation tables. The
# default is no positional encoding: it had the lower leave-family-out MAPE on both datasets
# (timm-rtx3090 13.2% vs 14.1%, better on 4 of 5 folds; local CPU 15.1% vs 15.5%, 2 of 5).
PAPER_PE = ("depth", "laplacian")
ARCH_LABELS = {"mdot": "MDOT", "gnn": "GNN", "lstm": "LSTM", "per_op": "per-operator"}


@dataclass(frozen=True)
class ModelConfig:
    arch: str = "mdot"  # mdot | lstm | gnn | per_op (baselines in mdot_jax.baselines)
    vocab_size: int = len(VOCAB)
    config_dim: int = CONFIG_DIM
    load_dim: int = LOAD_DIM
    lap_dim: int = 8
    rw_dim: int = 8
    workload_dim: int = 0  # set from the data
    d_model: int = 32
    n_heads: int = 4
    n_layers: int = 2
    attn_block: int = 128  # longer sequences use block-local attention + block summaries
    mlp_ratio: int = 2
    fusion: str = "transformer"  # transformer (the paper's) | concat (ablation)
    pe: tuple[str, ...] = ()  # subset of PE_KINDS; see PAPER_PE
    readout: str = "pool"  # pool | per_op (sum of per-operator times)
    dropout: float = 0.1

    def __post_init__(self):
        unknown = set(self.pe) - set(PE_KINDS)
        if unknown:
            raise ValueError(f"unknown positional encodings {sorted(unknown)}; "
                             f"choose from {PE_KINDS}")
        if self.fusion not in ("transformer", "concat"):
            raise ValueError(f"fusion must be transformer or concat, not {self.fusion!r}")
        if self.readout not in ("pool", "per_op"):
            raise ValueError(f"readout must be pool or per_op, not {self.readout!r}")

    def replace(self, **kw) -> "ModelConfig":
        return dataclasses.replace(self, **kw)

    @property
    def label(self) -> str:
        """The model's name in messages and model cards (MDOT, GNN, ...)."""
        return ARCH_LABELS.get(self.arch, self.arch)

    @property
    def method(self) -> str:
        """The `mdot evaluate` method that trains this model: whose results are its recipe's."""
        if self.arch != "mdot":
            return self.arch
        return {(): "mdot-pe-none", PAPER_PE: "mdot"}.get(self.pe, f"mdot-pe-{'+'.join(self.pe)}")


def tiny_config(workload_dim: int) -> ModelConfig:
    """A small config for tests, derived from the default."""
    return ModelConfig(workload_dim=workload_dim, d_model=16, n_heads=2, n_layers=1,
                       attn_block=64,  # longer test sequences go through block attention
                       pe=PAPER_PE)  # so that tests go through the positional encodings


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
        count = jnp.maximum(mask.sum(axis=1, keepdims=True), 1)  # [B, 1]
        mean = x.sum(axis=1) / count  # [B, D]
        mx = jnp.where(mask[..., None], x, -1e9).max(axis=1)  # [B, D]
        mx = jnp.where(count > 0, mx, 0.0)
        w = self.workload(batch.workload)  # [B, K, D]
        pooled = with_workloads(jnp.concatenate([mean, mx], axis=-1), w)  # [B, K, 3D]
        B, K, T = w.shape[0], w.shape[1], x.shape[1]
        if self.cfg.readout == "per_op":
            per_op, total = per_op_log_times(self.op_head, x, w, mask)
            return total + self.head(pooled)[..., 0], per_op
        return self.head(pooled)[..., 0], jnp.zeros((B, K, T), x.dtype)
