"""Recurrent layers (ONNX's LSTM, GRU and RNN) as cuDNN runs them in a training step, one step
after another: the input's GEMM for every step at once, then each step's recurrent GEMM and
its gates' pointwise kernel in turn (each direction's steps one after the other); the
backward the same in reverse (the gates' gradients, then the hidden state's GEMM, each step),
then the input's and both weights' gradients as single GEMMs over every step. cuDNN issues a
step's kernels itself, so the host issues one launch for a layer's steps, not one a kernel.
At fp32 cuDNN runs the GEMMs in TF32 (PyTorch's default, `torch.backends.cudnn.allow_tf32`)
where the GPU has it: priced so (`cudnn_gemms`; docs/studies/whole-layers.md, adopted by its
rule on the H100's measured LSTMs). Structure, not measured at half precision."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from converters.sequence import CONFIG_FIELDS

if TYPE_CHECKING:
    from mdot_jax.gpu.catalog import GPU

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
_C = {name: i for i, name in enumerate(CONFIG_FIELDS)}


def _dims(c: np.ndarray) -> tuple[int, int, int, int, int]:
    """(steps T, batch B, input I, directions D, hidden H) of a recurrent layer's config row."""
    t, b, i = (int(c[_C[f"in_d{k}"]]) for k in (1, 2, 3))
    return t, b, i, int(c[_C["out_d1"]]), int(c[_C["out_d3"]])


def kernels(op_type: str, c: np.ndarray, data: bool, weights: bool
            ) -> list[tuple[str, str, tuple, int]]:
    """(phase, operator, dims, times run) of the kernels of one recurrent layer (config row
    `c`: input [T, B, I], output [T, D, B, H]); `data`, `weights`: whether the backward makes
    the input's and the weights' gradients. GEMMs as `linear` (1, M, N, K), the gates as `tanh`
    (rows, width), `gpu.work`'s dims."""
    t, b, i, d, h = _dims(c)
    g = GATES[op_type] * h  # a direction's gates
    steps = t * d
    out = [("fw", "linear", (1, t * b, d * g, i), 1),  # every step's input at once
           ("fw", "linear", (1, b, g, h), steps), ("fw", "tanh", (b, g), steps),
           ("bw", "tanh", (b, g), steps), ("bw", "linear", (1, b, h, g), steps)]
    if data:
        out.append(("bw", "linear", (1, t * b, i, d * g), 1))
    if weights:  # dW [D G, I] and dR [D G, H], each summed over every step
        out += [("bw", "linear", (1, d * g, n, t * b), 1) for n in (i, h)]
    return out


def cudnn_gemms(info: dict, gpu: GPU, precision: str) -> tuple[GPU, Callable] | None:
    """(the GPU as an fp32 recurrent layer's GEMMs see it, their pricer) where cuDNN runs them
    in TF32 (`gpu` has TF32 and the step model `info` its tensor-core GEMMs); else None."""
    from mdot_jax.gpu import catalog, peaks

    tc = peaks.tensor_core_gemms(info, gpu, "tf32") if precision == "fp32" else None
    if tc is None:
        return None
    return catalog.as_seen(gpu, gpu.tflops["tf32"], 4), functools.partial(tc[1].ms, "tf32")


def kept_bytes(op_type: str, c: np.ndarray) -> float:
    """The fp32 bytes a recurrent layer (config row `c`) keeps for its backward besides its
    output: every step's gates (cuDNN's reserve space; autograd's saved gates on a CPU)."""
    t, b, _, d, h = _dims(c)
    return 4.0 * t * b * d * GATES[op_type] * h


def said(layers: dict[str, int]) -> str:
    """The warning of the recurrent `layers` (type -> how many) a step priced."""
    listed = ", ".join(f"{n} {k}" for k, n in sorted(layers.items()))
    return (f"recurrent layers ({listed}) priced as cuDNN runs them: each step's GEMM and "
            "gates' kernel in turn, both ways (not measured)")
