"""The networks: `Batch -> (normalised log time [B, K], per-operator scores [B, K, T])`.
Beside them: the tree model (`trees`), the kernel cost model (`kernels`), how members are
combined (`ensemble`) and a trained network with its statistics (`trained`).

All are trained by the same `mdot_jax.training.train` with the same features, budget and
splits; `ModelConfig.arch` picks one.
"""

from flax import nnx

from mdot_jax.models.config import PAPER_PE, PE_KINDS, ModelConfig, tiny_config
from mdot_jax.models.gnn import GNN
from mdot_jax.models.lstm import LSTM
from mdot_jax.models.mdot import MDOT
from mdot_jax.models.per_op import PerOp

ARCHS = {"mdot": MDOT, "gnn": GNN, "lstm": LSTM, "per_op": PerOp}
__all__ = ["ARCHS", "GNN", "LSTM", "MDOT", "PAPER_PE", "PE_KINDS", "ModelConfig", "PerOp",
           "build_model", "tiny_config"]


def build_model(cfg: ModelConfig, rngs: nnx.Rngs) -> nnx.Module:
    if cfg.arch not in ARCHS:
        raise ValueError(f"unknown architecture {cfg.arch!r}: choose from {sorted(ARCHS)}")
    return ARCHS[cfg.arch](cfg, rngs=rngs)
