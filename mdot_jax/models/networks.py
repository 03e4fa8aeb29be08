"""The networks' registry: `ModelConfig.arch` -> its Flax module."""

from __future__ import annotations

from flax import nnx

from mdot_jax.models.config import ModelConfig
from mdot_jax.models.gnn import GNN
from mdot_jax.models.lstm import LSTM
from mdot_jax.models.mdot import MDOT
from mdot_jax.models.per_op import PerOp

ARCHS = {"mdot": MDOT, "gnn": GNN, "lstm": LSTM, "per_op": PerOp}


def build_model(cfg: ModelConfig, rngs: nnx.Rngs) -> nnx.Module:
    if cfg.arch not in ARCHS:
        raise ValueError(f"unknown architecture {cfg.arch!r}: choose from {sorted(ARCHS)}")
    return ARCHS[cfg.arch](cfg, rngs=rngs)
