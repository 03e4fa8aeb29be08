"""Named recipes: which network, which training budget, with or without the LightGBM companion.

`mdot train --recipe NAME` (default `shipped`, what the shipped checkpoints were trained with)
and `mdot evaluate --methods NAME,...` both read this file, so a recipe and the evaluation row
that measured it cannot drift apart. Overrides come as `dataclasses.replace`, never copies.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from mdot_jax.models import PAPER_PE, PE_KINDS, ModelConfig, tiny_config
from mdot_jax.training.train import TrainConfig


@dataclass(frozen=True)
class Recipe:
    model: ModelConfig
    train: TrainConfig
    companion: bool  # fit the LightGBM companion and predict the geometric mean of the two
    description: str

    def replace(self, **kw) -> Recipe:
        return dataclasses.replace(self, **kw)


RECIPES = {
    "shipped": Recipe(ModelConfig(arch="gnn"), TrainConfig(epochs=30, patience=6), True,
                      "GNN + LightGBM companion: the shipped checkpoints' recipe"),
    "paper": Recipe(ModelConfig(pe=PAPER_PE), TrainConfig(), False,
                    "the paper's MDOT Transformer (depth + Laplacian positional encodings)"),
    "mdot": Recipe(ModelConfig(), TrainConfig(), True,
                   "MDOT without positional encoding + LightGBM companion (with --op-costs: "
                   "the op-grounded Zen 4 checkpoint's, and the operator sum)"),
    "tiny": Recipe(tiny_config(0), TrainConfig(epochs=2, patience=2, tokens_per_batch=2048), True,
                   "a few seconds of training, for tests and smoke runs"),
}
DEFAULT_RECIPE = "shipped"


def get(name: str) -> Recipe:
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}: choose from {', '.join(RECIPES)}")
    return RECIPES[name]


def method_models() -> dict[str, ModelConfig]:
    """The networks `mdot evaluate` compares, by method name: the paper's MDOT (`mdot`), its
    ablations (`mdot-pe-<kind>`, one positional encoding or none; `mdot-concat`; `mdot-per_op`)
    and the neural baselines (`gnn`, `lstm`, `per_op`), all at the paper's defaults otherwise."""
    paper = RECIPES["paper"].model
    models = {"mdot": paper, "mdot-concat": paper.replace(fusion="concat"),
              "mdot-per_op": paper.replace(readout="per_op"),
              "gnn": paper.replace(arch="gnn"), "lstm": paper.replace(arch="lstm"),
              "per_op": paper.replace(arch="per_op")}
    models.update({f"mdot-pe-{k}": paper.replace(pe=() if k == "none" else (k,))
                   for k in PE_KINDS})
    return models
