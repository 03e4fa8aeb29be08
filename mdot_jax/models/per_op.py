"""Per-operator regressor (PerfNet/Habitat-style): one time per operator, summed, trained
with the total time only (no interaction between operators)."""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from mdot_jax.data.features import Batch
from mdot_jax.models.config import ModelConfig
from mdot_jax.models.layers import Mlp, OperatorEncoder, per_op_log_times


class PerOp(nnx.Module):
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
