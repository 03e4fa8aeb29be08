"""The networks: `Batch -> (normalised log time [B, K], per-operator scores [B, K, T])`.
Beside them: the tree model (`trees`), the kernel cost model (`kernels`), how members are
combined (`ensemble`) and a trained network with its statistics (`trained`).

All are trained by the same `mdot_jax.training.train` with the same features, budget and
splits; `ModelConfig.arch` picks one.
"""

from typing import Any

from mdot_jax.models.config import PAPER_PE, PE_KINDS, ModelConfig, tiny_config

NETWORKS = ("ARCHS", "GNN", "LSTM", "MDOT", "PerOp", "build_model")  # `models.networks`' names
__all__ = [*NETWORKS, "PAPER_PE", "PE_KINDS", "ModelConfig", "tiny_config"]


def __getattr__(name: str) -> Any:
    """The networks (Flax modules), imported when first asked for: the tree model and a
    spec sheet's prediction need none of them, nor JAX."""
    if name in NETWORKS:
        import mdot_jax.models.networks as networks

        return getattr(networks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
