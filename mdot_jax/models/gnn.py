"""Message passing over the ONNX graph (DNNPerf-style), the shipped checkpoints' network.

Operators are embedded by the concat fusion of type, configuration and load; each round sums
messages from inputs and from users (segment sums over the padded edge lists), with a residual
update and LayerNorm; a masked pool meets the workload. No positional encoding: the edges are
the structure."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from mdot_jax.data.features import Batch
from mdot_jax.models.config import ModelConfig
from mdot_jax.models.layers import Mlp, OperatorEncoder, masked_pool, no_scores, with_workloads


class GNN(nnx.Module):
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
        pooled = with_workloads(masked_pool(h, batch.mask), w)  # [B, K, 3D]
        return self.head(pooled)[..., 0], no_scores(w, batch.mask)
