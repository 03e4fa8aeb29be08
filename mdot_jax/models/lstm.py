"""LSTM over the topological operator sequence (the sequence model MDOT improves on).

Operators are embedded by the concat fusion of type, configuration and load; the last state
and a masked pool of all states meet the workload."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from mdot_jax.data.features import Batch
from mdot_jax.models.config import ModelConfig
from mdot_jax.models.layers import Mlp, OperatorEncoder, masked_pool, no_scores, with_workloads


class LSTM(nnx.Module):
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
        mean = masked_pool(x, mask)[:, : x.shape[-1]]  # [B, D]
        pooled = with_workloads(jnp.concatenate([h_last, mean], -1), w)  # [B, K, 3D]
        return self.head(pooled)[..., 0], no_scores(w, mask)
