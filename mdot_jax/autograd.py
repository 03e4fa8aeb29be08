"""Which backward kernels autograd runs, where some parameters are frozen (`requires_grad` off:
LoRA, a frozen backbone; recorded by the exporter, `converters.sequence.FROZEN_KEY`).

- an operator's backward runs only where its output depends on a trained parameter (one it
  holds, or one upstream): nothing before the first trained parameter has a backward;
- its inputs' gradient only where one of its inputs depends on a trained parameter (none where
  it reads only the graph's inputs);
- its weights' gradient (a GEMM's or convolution's weight-gradient kernel, the gradient's
  accumulation, autocast's cast of it) only where it holds a trained parameter or reads one
  through views (a linear layer's transposed weight); a GEMM of two activations (attention's)
  computes both operands' gradients where its backward runs.

Where every parameter trains, each operator has a backward as before (the step's rules in
`gpu.spec_sheet`), its inputs' gradient wherever it reads another operator's output.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from converters import OperatorSequence
from converters.kept import KEPT
from converters.sequence import CONFIG_FIELDS

_C = {name: i for i, name in enumerate(CONFIG_FIELDS)}


def trainable(seq: OperatorSequence) -> int:
    """Of `seq.params`, those trained (not frozen: `requires_grad` off where exported)."""
    return seq.params - int(seq.meta.get("frozen", 0))


def sharded(seq: OperatorSequence, params: np.ndarray) -> dict:
    """`seq.meta`'s frozen count for a shard of it whose operators hold `params` `[N]` (a
    tensor- or expert-parallel GPU's): the frozen operators' share, as theirs shrank."""
    if "frozen" not in seq.meta:
        return {}
    mask = frozen_nodes(seq)
    before = float(seq.column("params")[mask].sum())
    return {"frozen": int(round(seq.meta["frozen"] * float(params[mask].sum()) / max(before, 1)))}


def frozen_nodes(seq: OperatorSequence) -> np.ndarray:
    """`[N] bool`: operators all of whose parameters are frozen (no weight gradient)."""
    mask = np.zeros(seq.num_ops, bool)
    mask[list(seq.meta.get("frozen_nodes", ()))] = True
    return mask


# how frozen parameters may be held (`TrainingJob.frozen_weights`): bytes a parameter. nf4 is
# QLoRA's (bitsandbytes' 4-bit NormalFloat with double quantisation: 4 bits, an 8-bit scale
# per 64 and an fp32 one per 256 of those) for the linear layers but the head, their other
# frozen parameters in bf16; each such weight dequantised to bf16 for every GEMM that reads it
FROZEN_BYTES = {"bf16": 2.0, "fp16": 2.0, "nf4": 2.0}  # keys: `options.FROZEN_WEIGHTS`
NF4_BYTES = (4 + 8 / 64 + 32 / (64 * 256)) / 8


def quantized(seq: OperatorSequence) -> dict[int, tuple[int, int]]:
    """Under `frozen_weights` nf4, {linear GEMM: (the operator holding its frozen weight, the
    weight's elements)} of every linear layer but the last (the output head, which QLoRA
    keeps in bf16)."""
    if seq.meta.get("frozen_weights") != "nf4":
        return {}
    return {i: (holder, k * n) for i, (holder, k, n) in hidden_weights(seq, frozen=True).items()}


def hidden_weights(seq: OperatorSequence, frozen: bool) -> dict[int, tuple[int, int, int]]:
    """{linear GEMM: (the operator holding its weight, K, N)} of every linear layer but the
    last one of the graph (the output head, tied to the embedding or not) whose [K, N] weight
    is `frozen` (else trained), held by the layer or read through a view (a transposed
    weight)."""
    from mdot_jax.gpu.classify import classified

    mask = frozen_nodes(seq) if frozen else ~frozen_nodes(seq)
    preds = seq.neighbours()[0]
    held, view = seq.column("params"), weight_views(seq)
    linears = [(i, dims) for i, (_, op, dims) in enumerate(classified(seq)) if op == "linear"]
    out = {}
    for i, dims in linears[:-1]:
        k, n = int(dims[3]), int(dims[2])  # (1, M, N, K): a [K, N] weight
        holders = [j for j in (i, *preds.get(i, ())) if (j == i or view[j]) and mask[j]
                   and held[j] >= k * n]  # the layer itself, or a view of its weight
        if holders:
            out[i] = (holders[0], k, n)
    return out


def weight_bytes(seq: OperatorSequence, each: float) -> np.ndarray:
    """`[N]` bytes of the parameters each operator holds: `each` a trained one, a frozen one as
    the sequence's `frozen_weights` says (default: as the trained)."""
    held = seq.column("params")
    how = seq.meta.get("frozen_weights")
    if how is None:
        return held * each
    out = np.where(frozen_nodes(seq), held * FROZEN_BYTES[how], held * each)
    for holder, weight in quantized(seq).values():
        out[holder] -= weight * (FROZEN_BYTES[how] - NF4_BYTES)
    return out


def held_bytes(seq: OperatorSequence, each: float) -> float:
    """Bytes of the model's weights as held (`weight_bytes`; a tied weight once)."""
    if seq.meta.get("frozen_weights") is None:
        return each * seq.params
    return float(weight_bytes(seq, each).sum()) * seq.params / max(seq.total("params"), 1.0)


@dataclass(frozen=True)
class Backward:
    """`[N] bool` masks over a sequence's operators (module docstring)."""

    runs: np.ndarray  # its backward runs at all
    data: np.ndarray  # its inputs' gradient is computed
    weights: np.ndarray  # its parameters' gradients are (where it holds any)
    weight: np.ndarray  # reads parameters alone (a weight's view: a GEMM's operand)
    frozen: bool = False  # some parameters are (else every mask is the full step's)


def backward(seq: OperatorSequence) -> Backward:
    """The backward kernels autograd runs for `seq` (module docstring), kept while `seq` is."""
    return KEPT.get(("backward", seq), lambda: _backward(seq))


def _backward(seq: OperatorSequence) -> Backward:
    n = seq.num_ops
    held = seq.column("params") > 0
    preds, _ = seq.neighbours()
    frozen, weight = frozen_nodes(seq), weight_views(seq)
    if not frozen.any():  # every operator's backward, as the step's rules always priced it
        reads = np.zeros(n, bool)  # a data gradient: it reads a tensor not a weight's
        reads[[i for i, ps in preds.items() if any(not weight[p] for p in ps)]] = True
        return Backward(np.ones(n, bool), reads, np.ones(n, bool), weight)
    trained = held & ~frozen
    runs, data, weights = (np.zeros(n, bool) for _ in range(3))
    for i in range(n):  # producers before consumers (edges run forward)
        ps = preds.get(i, [])
        data[i] = any(runs[p] for p in ps if not weight[p])
        operands = [p for p in ps if weight[p]]  # none: its other operand is data too
        weights[i] = trained[i] or (any(runs[p] for p in operands) if operands or held[i]
                                    else data[i])
        runs[i] = data[i] or weights[i]
    return Backward(runs, data, weights, weight, True)


def without_backward(seq: OperatorSequence, groups: np.ndarray) -> np.ndarray:
    """The ids of `groups` (`[N] int`: each operator's group, -1 none) none of whose operators
    has a backward (`backward`): all of them frozen, and nothing trained before them."""
    grads, grouped = backward(seq), groups >= 0
    if not grads.frozen:
        return np.zeros(0, groups.dtype)
    return np.setdiff1d(groups[grouped], groups[grads.runs & grouped])


def weight_views(seq: OperatorSequence) -> np.ndarray:
    """`[N] bool`: operators that read parameters alone (a weight, or a view of one: a GEMM's
    operand), kept while `seq` is."""
    def compute() -> np.ndarray:
        preds, _ = seq.neighbours()
        inputs, from_params = (seq.config[:, _C[f]] for f in ("n_inputs", "n_param_inputs"))
        weight = np.zeros(seq.num_ops, bool)
        for i in range(seq.num_ops):  # producers before consumers
            ps = preds.get(i, [])
            weight[i] = bool(ps or from_params[i]) and from_params[i] + len(ps) >= inputs[i] \
                and all(weight[p] for p in ps)
        return weight
    return KEPT.get(("weight_views", seq), compute)


PRODUCTS = ("MatMul", "Gemm", "Conv", "ConvTranspose", "Mul", "Div")  # an input kept for another's


def keeps(seq: OperatorSequence, grads: Backward, src: np.ndarray, dst: np.ndarray
          ) -> np.ndarray:
    """`[E]` whether operator `dst`'s backward keeps the output of `src` (edges), of those
    whose kind keeps its inputs: only where it computes a gradient that reads it, as autograd
    saves a tensor only for the gradients that use it (a product's operand for the other's: a
    frozen linear layer keeps no input, `x * 0.5` none). Where nothing is frozen, wherever the
    backward runs."""
    if not grads.frozen:
        return grads.runs[dst]
    names = seq.op_names
    product = np.isin(names[dst], PRODUCTS)
    held = (seq.column("params") > 0) & ~frozen_nodes(seq)  # a trained parameter operand
    preds, _ = seq.neighbours()
    other = np.asarray([held[d] or any(grads.runs[p] for p in preds.get(d, ()) if p != s)
                        for s, d in zip(src.tolist(), dst.tolist())], bool)  # requires grad
    gemm = np.isin(names[dst], PRODUCTS[:4])
    other = np.where(gemm & grads.weight[src], grads.data[dst],  # the weight, for the data's
                     np.where(gemm, grads.weights[dst], other))  # the data, for the weight's
    return np.where(product, other, grads.runs[dst])


def backward_flops(seq: OperatorSequence) -> np.ndarray:
    """`[N]` the backward's FLOPs: the converter's (`bwd_flops`), less what frozen parameters
    spare (a linear layer's or convolution's two gradients at its forward's FLOPs each, where
    autograd computes them)."""
    from mdot_jax.gpu.classify import classified

    bwd = seq.column("bwd_flops")
    if not frozen_nodes(seq).any():
        return bwd
    grads = backward(seq)
    gemm = np.asarray([op == "linear" or kind == "conv"
                       for kind, op, _ in classified(seq)], bool)
    return np.where(gemm, seq.column("fwd_flops") * (grads.data * 1.0 + grads.weights),
                    bwd * grads.runs)  # a batched GEMM's two operands are data
