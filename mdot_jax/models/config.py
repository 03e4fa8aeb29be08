"""`ModelConfig`: one frozen config for every network (MDOT and the baselines).

`arch` picks the network (`mdot_jax.models.ARCHS`); named recipes that fix it with a training
budget are in `mdot_jax.recipes`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from converters.vocab import VOCAB
from mdot_jax.data.features import CONFIG_DIM, LOAD_DIM

PE_KINDS = ("none", "sinusoidal", "depth", "laplacian", "random_walk", "distance_bias")
# The paper's graph positional encoding (the `mdot` method of `mdot evaluate`). `ModelConfig`
# defaults to none: simpler and cheaper, and not measurably less accurate (docs/evaluation.md).
PAPER_PE = ("depth", "laplacian")
ARCH_LABELS = {"mdot": "MDOT", "gnn": "GNN", "lstm": "LSTM", "per_op": "per-operator"}
_MAY_BE_ZERO = {"lap_dim", "rw_dim", "workload_dim"}  # integer fields that may be 0


def check_numbers(config) -> None:
    """Each int or float field of the dataclass `config` (JSON overrides arrive untyped) a
    finite number, and each int one whole: a ValueError naming the field otherwise."""
    for f in dataclasses.fields(config):
        v, kind = getattr(config, f.name), type(f.default)
        if kind in (int, float) and (isinstance(v, bool) or not isinstance(v, (int, float))
                                     or not math.isfinite(v)):
            raise ValueError(f"{f.name} {v!r}: expected a number")
        if kind is int and v != int(v):
            raise ValueError(f"{f.name} {v!r}: expected an integer")


@dataclass(frozen=True)
class ModelConfig:
    arch: str = "mdot"  # a key of mdot_jax.models.ARCHS: mdot | gnn | lstm | per_op
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
        check_numbers(self)
        for f in dataclasses.fields(self):
            if type(f.default) is int and getattr(self, f.name) < (
                    low := 0 if f.name in _MAY_BE_ZERO else 1):
                raise ValueError(f"{f.name} {getattr(self, f.name)!r}: must be >= {low}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout {self.dropout!r}: must be in [0, 1)")
        if self.arch == "mdot" and self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model}: must be a multiple of n_heads "
                             f"{self.n_heads}")
        if self.arch not in ARCH_LABELS:
            raise ValueError(f"unknown arch {self.arch!r}; choose from {', '.join(ARCH_LABELS)}")
        unknown = set(self.pe) - set(PE_KINDS)
        if unknown:
            raise ValueError(f"unknown positional encodings {sorted(unknown)}; "
                             f"choose from {PE_KINDS}")
        if self.fusion not in ("transformer", "concat"):
            raise ValueError(f"fusion must be transformer or concat, not {self.fusion!r}")
        if self.readout not in ("pool", "per_op"):
            raise ValueError(f"readout must be pool or per_op, not {self.readout!r}")

    def replace(self, **kw) -> ModelConfig:
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
