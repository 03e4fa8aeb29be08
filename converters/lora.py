"""Low-rank adaptation (LoRA): a model's linear layers frozen, each targeted one beside a
trainable update of rank r, as peft's `LoraConfig(r=r, target_modules=...)` builds it
(`lora_dropout=0`, its default: no dropout kernel).

    y = base(x) + B(A(x)) * alpha / r      A: [in, r], B: [r, out]; base frozen

Every other parameter is frozen too (peft's default): the export records the frozen ones
(`sequence.FROZEN_KEY`) so that the step is priced without their weight gradients, gradient
communication and optimizer state.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from converters.errors import ConversionError

ALL_LINEAR = "all-linear"  # peft's name: every linear layer but the output head


def add_adapters(model: Any, rank: int, targets: Sequence[str] = (ALL_LINEAR,),
                 alpha: float | None = None, trained: Sequence[str] = ()) -> list[str]:
    """`model` (a torch module, on any device) with LoRA adapters of `rank` on the linear
    layers `targets` names (their last name component, e.g. `q_proj`; `all-linear`: every
    linear layer but the output embeddings), every other parameter frozen but those of the
    modules `trained` names (its children: peft's `modules_to_save`, a classifier's head,
    trained in full and not adapted). Returns the names of the layers adapted. A target
    naming no linear layer is a `ConversionError`."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank <= 0:
        raise ConversionError(f"--lora-rank {rank!r}: expected a positive integer")
    linear = {n: m for n, m in _linear_layers(model).items() if n.split(".")[0] not in trained}
    if ALL_LINEAR in targets:
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        chosen = [n for n, m in linear.items() if m is not head]
    else:
        chosen = [n for n in linear if n.rpartition(".")[2] in targets]
        known = sorted({n.rpartition(".")[2] for n in linear})
        for t in targets:
            if not any(n.rpartition(".")[2] == t for n in chosen):
                raise ConversionError(f"--lora-targets {t!r}: names no linear layer of "
                                      f"{type(model).__name__} (its linear layers: "
                                      f"{', '.join(known[:12])}{', ...' if len(known) > 12 else ''}"
                                      f"; or {ALL_LINEAR})")
    if not chosen:
        raise ConversionError(f"--lora-rank: {type(model).__name__} has no linear layer to adapt")
    side = max(min(linear[n].weight.shape) for n in chosen)  # the widest layer's smaller side
    if rank > side:  # a typo's extra digits: adapters larger than the weights they adapt
        raise ConversionError(f"--lora-rank {rank:,}: more than the smaller side of every layer "
                              f"it adapts (at most {side:,}): such adapters hold more than the "
                              "weights they adapt (ranks of 8-256 are usual)")
    for name, p in model.named_parameters():
        p.requires_grad_(name.split(".")[0] in trained)
    for name in chosen:
        parent, _, attr = name.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        setattr(owner, attr, _lora_linear()(linear[name], rank, alpha or 2.0 * rank))
    return chosen


def _linear_layers(model: Any) -> dict[str, Any]:
    """{name: module} of `model`'s linear layers: torch's `Linear` and transformers' `Conv1D`
    (GPT-2's, a linear layer with its weight as [in, out])."""
    import torch

    return {n: m for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D"}


def _features(layer: Any) -> tuple[int, int]:
    """(in, out) features of a linear layer (`Conv1D`'s weight is [in, out])."""
    if hasattr(layer, "in_features"):
        return int(layer.in_features), int(layer.out_features)
    n_in, n_out = layer.weight.shape
    return int(n_in), int(n_out)


@functools.cache
def _lora_linear() -> type:
    """The module of a frozen linear layer beside its trainable low-rank update (made once,
    with torch imported: converters import no torch at load)."""
    import torch

    class LoraLinear(torch.nn.Module):
        def __init__(self, base: Any, rank: int, alpha: float):
            super().__init__()
            n_in, n_out = _features(base)
            kind = dict(device=base.weight.device, dtype=base.weight.dtype, bias=False)
            self.base_layer = base
            self.lora_A = torch.nn.Linear(n_in, rank, **kind)
            self.lora_B = torch.nn.Linear(rank, n_out, **kind)
            self.scaling = alpha / rank

        @property
        def weight(self) -> Any:  # what model code reads of the layer it wraps (T5's, peft's)
            return self.base_layer.weight

        @property
        def bias(self) -> Any:
            return self.base_layer.bias

        def forward(self, x: Any) -> Any:  # [..., in] -> [..., out]
            return self.base_layer(x) + self.lora_B(self.lora_A(x)) * self.scaling

    return LoraLinear
