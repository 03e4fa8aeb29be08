"""Neural baselines with MDOT's interface (`Batch -> (log time [B, K], scores [B, K, T])`), trained
by the same `train.train` with the same budget, features and splits.

- `lstm`: an LSTM over the topological sequence (the sequence model MDOT improves on);
- `gnn`: DNNPerf-style message passing over the DAG (segment sums, both directions);
- `per_op`: PerfNet/Habitat-style per-operator regressor, predictions summed, trained with
  the total time only (no interaction between operators).
All three embed an operator by the concat fusion of type, configuration and load.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from mdot_jax.features import Batch
from mdot_jax.model import (MDOT, Mlp, ModelConfig, OperatorEncoder, per_op_log_times,
                            with_workloads)


def _pool(x, mask):
    """Masked mean and max over operators: `[B, T, D] -> [B, 2D]`."""
    count = jnp.maximum(mask.sum(axis=1, keepdims=True), 1)
    mean = (x * mask[..., None]).sum(axis=1) / count
    mx = jnp.where(mask[..., None], x, -1e9).max(axis=1)
    return jnp.concatenate([mean, jnp.where(mask.any(axis=1, keepdims=True), mx, 0.0)], -1)


def _no_scores(w, mask):
    return jnp.zeros(w.shape[:2] + mask.shape[1:])  # [B, K, T]


class LSTMBaseline(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d = cfg.d_model
        self.encoder = OperatorEncoder(cfg.replace(fusion="concat"), rngs=rngs)
        self.cells = nnx.List([nnx.LSTMCell(d, d, rngs=rngs) for _ in range(cfg.n_layers)])
        self.workload = Mlp(cfg.workload_dim, 2 * d, d, rngs=rngs)
        self.head = Mlp(3 * d, 2 * d, 1, rngs=rngs)

    def __call__(self, batch: Batch, *, train: bool = False, rng=None):
        x = self.encoder(batch)  # [B, T, D]
        mask = batch.mask
        for cell in self.cells:
            carry = cell.initialize_carry((x.shape[0], x.shape[2]), nnx.Rngs(0))

            def step(carry, inp, cell=cell):
                xt, mt = inp  # [B, D], [B]
                new, y = cell(carry, xt)
                keep = mt[:, None]  # padding steps leave the state unchanged
                new = jax.tree.map(lambda a, b: jnp.where(keep, a, b), new, carry)
                return new, y * keep

            _, ys = jax.lax.scan(step, carry, (x.transpose(1, 0, 2), mask.T))
            x = ys.transpose(1, 0, 2)  # [B, T, D]
        last = jnp.maximum(mask.sum(axis=1) - 1, 0)  # final state of each sequence
        h_last = jnp.take_along_axis(x, last[:, None, None], axis=1)[:, 0]  # [B, D]
        w = self.workload(batch.workload)  # [B, K, D]
        pooled = with_workloads(jnp.concatenate([h_last, _pool(x, mask)[:, : x.shape[-1]]], -1), w)
        return self.head(pooled)[..., 0], _no_scores(w, mask)


class GNNBaseline(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d = cfg.d_model
        self.encoder = OperatorEncoder(cfg.replace(fusion="concat"), rngs=rngs)
        self.msg_in = nnx.List([nnx.Linear(d, d, rngs=rngs) for _ in range(cfg.n_layers + 1)])
        self.msg_out = nnx.List([nnx.Linear(d, d, rngs=rngs) for _ in range(cfg.n_layers + 1)])
        self.update = nnx.List([Mlp(3 * d, 2 * d, d, rngs=rngs)
                                for _ in range(cfg.n_layers + 1)])
        self.norms = nnx.List([nnx.LayerNorm(d, rngs=rngs) for _ in range(cfg.n_layers + 1)])
        self.workload = Mlp(cfg.workload_dim, 2 * d, d, rngs=rngs)
        self.head = Mlp(3 * d, 2 * d, 1, rngs=rngs)

    def __call__(self, batch: Batch, *, train: bool = False, rng=None):
        h = self.encoder(batch)  # [B, T, D]
        B, T, D = h.shape
        offset = (jnp.arange(B) * T)[:, None]  # flatten the batch into one graph
        snd = (batch.senders + offset).reshape(-1)  # [B*E]
        rcv = (batch.receivers + offset).reshape(-1)
        emask = batch.edge_mask.reshape(-1, 1)
        for w_in, w_out, upd, ln in zip(self.msg_in, self.msg_out, self.update, self.norms):
            flat = h.reshape(B * T, D)
            m_in = jax.ops.segment_sum(w_in(flat)[snd] * emask, rcv, B * T)  # from inputs
            m_out = jax.ops.segment_sum(w_out(flat)[rcv] * emask, snd, B * T)  # from users
            h = ln(h + upd(jnp.concatenate([flat, m_in, m_out], -1)).reshape(B, T, D))
            h = h * batch.mask[..., None]
        w = self.workload(batch.workload)  # [B, K, D]
        pooled = with_workloads(_pool(h, batch.mask), w)  # [B, K, 3D]
        return self.head(pooled)[..., 0], _no_scores(w, batch.mask)


class PerOpBaseline(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d = cfg.d_model
        self.encoder = OperatorEncoder(cfg.replace(fusion="concat"), rngs=rngs)
        self.workload = Mlp(cfg.workload_dim, 2 * d, d, rngs=rngs)
        self.op_head = Mlp(2 * d, 2 * d, 1, rngs=rngs)
        # the normalised target is ~0 while a sum over ~250 operators starts at log(250)
        self.offset = nnx.Param(jnp.array(-5.5))

    def __call__(self, batch: Batch, *, train: bool = False, rng=None):
        x = self.encoder(batch)  # [B, T, D]
        per_op, total = per_op_log_times(self.op_head, x, self.workload(batch.workload),
                                         batch.mask)
        return total + self.offset[...], per_op


ARCHS = {"mdot": MDOT, "lstm": LSTMBaseline, "gnn": GNNBaseline, "per_op": PerOpBaseline}


def build_model(cfg: ModelConfig, rngs: nnx.Rngs) -> nnx.Module:
    if cfg.arch not in ARCHS:
        raise ValueError(f"unknown architecture {cfg.arch!r}: choose from {sorted(ARCHS)}")
    return ARCHS[cfg.arch](cfg, rngs=rngs)
