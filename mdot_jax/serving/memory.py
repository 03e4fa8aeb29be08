"""The peak memory of a training step, estimated from the operator sequence: whether the step
fits on the device at all, before its time means anything.

peak = parameters + their gradients + the optimizer's state + the activations kept for the
backward pass + the input batch + the working set, where
- parameters, gradients and optimizer state are fp32 (also under AMP, which keeps fp32 master
  weights); the state is `OPTIMIZER_STATE` tensors the size of the parameters;
- the activations are the tensors autograd keeps for the backward pass: an operator's output
  where its own backward needs it (Relu, Sigmoid, Softmax, ...) or where a consumer's backward
  needs its input (Conv, MatMul, normalisations, Mul, GELU, pooling, ...), each once, at the
  precision's width (half under AMP); an output only added, reshaped or concatenated onward is
  freed, and views write nothing;
- the working set is what lives only while a step runs: the backward's transient gradients
  (the gradient of an operator's output and of its input, at most the two largest outputs)
  and, on a CPU, one working copy of the parameters (the kernels' reordered weights, the
  optimizer's temporaries; a GPU's caching allocator reuses such blocks).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from converters import OperatorSequence
from converters.sequence import LOAD_FIELDS
from converters.vocab import VOCAB

# fp32 tensors of optimizer state per parameter tensor: SGD with momentum (what `mdot profile`
# and timm's benchmark train with) keeps one, Adam and AdamW two, plain SGD none
OPTIMIZER_STATE = {"sgd": 1, "sgd-plain": 0, "momentum": 1, "adam": 2, "adamw": 2}
HALF = {"amp-fp16", "amp-bf16", "bf16"}
_WRITTEN = LOAD_FIELDS.index("bytes_written")
# whose backward needs the operator's input, or its output (PyTorch's derivatives)
NEEDS_INPUT = frozenset({
    "Conv", "ConvTranspose", "MatMul", "Gemm", "Einsum", "BatchNormalization",
    "LayerNormalization", "GroupNormalization", "InstanceNormalization", "Mul", "Div", "Pow",
    "Gelu", "Silu", "Erf", "MaxPool", "HardSwish", "HardSigmoid", "LeakyRelu", "Clip", "Mish",
    "Softplus", "Elu", "Selu", "PRelu", "ReduceMax", "ReduceMin", "Where", "Max", "Min",
    "Abs", "Log", "Sin", "Cos"})
NEEDS_OUTPUT = frozenset({"Relu", "Sigmoid", "Tanh", "Softmax", "LogSoftmax", "Exp", "Sqrt",
                          "Reciprocal"})


@dataclass(frozen=True)
class StepMemory:
    """Bytes of one training step, by what holds them."""

    parameters: float
    gradients: float
    optimizer: float
    activations: float
    inputs: float
    working: float = 0.0

    @property
    def total(self) -> float:
        return (self.parameters + self.gradients + self.optimizer + self.activations
                + self.inputs + self.working)

    def to_json(self) -> dict:
        return dict(parameters=self.parameters, gradients=self.gradients,
                    optimizer=self.optimizer, activations=self.activations, inputs=self.inputs,
                    working=self.working, total=self.total)


def step_memory(seq: OperatorSequence, precision: str = "fp32", optimizer: str = "sgd",
                cpu: bool = False) -> StepMemory:
    """The estimate for `seq` (at its batch size) trained at `precision` with `optimizer`, on
    a CPU or (`cpu` False) a GPU."""
    if optimizer not in OPTIMIZER_STATE:
        raise ValueError(f"optimizer {optimizer!r}: choose from {sorted(OPTIMIZER_STATE)}")
    weights = 4.0 * seq.params
    scale = 0.5 if precision in HALF else 1.0  # the sequence's bytes are fp32
    inputs = float(sum(4.0 * np.prod(s) for s in seq.meta.get("inputs", {}).values()))
    outputs = np.sort(np.asarray(seq.load[:, _WRITTEN], np.float64))
    working = scale * float(outputs[-2:].sum()) + (weights if cpu else 0.0)
    return StepMemory(weights, weights, OPTIMIZER_STATE[optimizer] * weights,
                      scale * saved_bytes(seq), inputs, working)


def saved_bytes(seq: OperatorSequence) -> float:
    """Bytes of the operators' outputs that autograd keeps for the backward pass (fp32)."""
    names = np.asarray([*VOCAB, "?"])[np.minimum(seq.op_type, len(VOCAB))]
    kept = np.isin(names, list(NEEDS_OUTPUT))
    if len(seq.edges):
        src, dst = seq.edges[:, 0], seq.edges[:, 1]
        kept[src[np.isin(names[dst], list(NEEDS_INPUT))]] = True
    return float(np.asarray(seq.load[kept, _WRITTEN], np.float64).sum())


def machine_memory() -> float | None:
    """This machine's RAM, bytes (None where the system does not say)."""
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None
