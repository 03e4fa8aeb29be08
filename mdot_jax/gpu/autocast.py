"""The cast kernels PyTorch's autocast (`amp-*` precisions) adds to a training step
(`gpu.spec_sheet` prices them), found by following each tensor's type through the step
(`types`): each weight and bias a GEMM or convolution reads, cast to the half type in the
forward and its gradient back; each fp32 activation such a node reads, likewise; each half
tensor an autocast fp32 operator reads, cast up and its gradient back; and the gradient of a
half tensor another operator promoted to fp32 (a half branch added to an fp32 residual), cast
back. Frozen weights held in the half type need none; QLoRA's 4-bit ones are dequantised for
each GEMM instead (`dequantised`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from converters import OperatorSequence
from converters.kept import KEPT
from converters.sequence import CONFIG_FIELDS
from mdot_jax.autograd import NF4_BYTES, Backward, frozen_nodes, quantized, trainable
from mdot_jax.gpu.catalog import GPU
from mdot_jax.options import HALF

# autocast's fp32 operators (a half input cast up, an fp32 output) and explicit casts
FP32_LIST = frozenset({"Softmax", "LogSoftmax", "SoftmaxCrossEntropyLoss", "LayerNormalization",
                       "GroupNormalization", "Pow", "Exp", "Log", "Reciprocal", "Cast"})
READ_IN_PLACE = frozenset({"Softmax", "LogSoftmax"})  # at fp16 PyTorch's half_to_float
# kernels read the half input: no cast (at bf16 one; cross-entropy casts at both)
KEEPS_TYPE = frozenset({"Dropout", "BatchNormalization"})  # a half input gives a half output
GEMMS = ("linear", "bmm", "conv")  # autocast's half operators
HALF_TYPE = {"amp-fp16": "fp16", "amp-bf16": "bf16", "fp8": "bf16"}  # autocast's, a precision
NO_TYPE, HALF_OUT, FP32_OUT = 0, 1, 2  # `types`' codes
_C = {name: i for i, name in enumerate(CONFIG_FIELDS)}


def types(seq: OperatorSequence, kinds: list[str]) -> np.ndarray:
    """`[N] int8`: each node's output type under autocast (`HALF_OUT`, `FP32_OUT`; `NO_TYPE`:
    integers and booleans). GEMMs and convolutions write the half type; autocast's fp32
    operators and casts fp32; views, dropout and batch norm their input's; any other float
    operator the half type where it reads half nodes alone, else fp32 (an fp32 node or a
    parameter, a dimensioned fp32 tensor, promotes; reading no node, graph inputs: fp32)."""
    reads, _ = seq.neighbours()
    names, held = seq.op_names, seq.column("params")
    width = seq.config[:, _C["elem_bytes"]]
    out = np.zeros(seq.num_ops, np.int8)
    for i, kind in enumerate(kinds):
        if width[i] not in (2, 4):  # integers, booleans
            continue
        half = {int(out[j]) for j in reads.get(i, [])} - {NO_TYPE} == {HALF_OUT}
        if kind in GEMMS:
            out[i] = HALF_OUT
        elif names[i] in FP32_LIST:
            out[i] = FP32_OUT
        else:
            keeps = kind == "free" or names[i] in KEEPS_TYPE
            out[i] = HALF_OUT if half and (keeps or held[i] == 0) else FP32_OUT
    return out


def casts(seq: OperatorSequence, kinds: list[str], skip: set[int], gpu: GPU,
          half_weights: bool, grads: Backward, precision: str, activations: bool = True
          ) -> list[tuple[int, str, str, tuple, GPU, float]]:
    """The cast kernels autocast at `precision` adds (the module docstring's), as
    `spec_sheet.price` lists work: (node, phase, operator, dims, GPU, 1.0); with
    `half_weights`, no weight's; `grads`: the backward autograd runs (`autograd.backward`), a
    frozen weight's gradient never cast back; without `activations`, no activation's (a
    compiled step stores them cast: `gpu.compiled`). `skip`: nodes fused kernels run."""
    weights = 0 if half_weights else 1
    names, held = seq.op_names, _cast_held(seq, precision)
    of = KEPT.get(("autocast types", seq), lambda: types(seq, kinds))  # as `_walks`' kinds
    walked = _walks(seq, kinds)
    numel = seq.config[:, _C["out_numel"]]
    out: list[tuple[int, str, str, tuple, GPU, float]] = []

    def cast(i: int, n: float, phases: tuple[str, ...]) -> None:
        out.extend((i, phase, "addu", (1, int(n)), gpu, 1.0) for phase in phases if n > 0)

    for i, kind in enumerate(kinds):
        if i in skip or kind == "free":
            continue
        back = ("fw", "bw") if grads.data[i] else ("fw",)  # its input's gradient, cast back
        if kind in GEMMS:
            views, producers = walked(i)  # the views holding a weight, the producers
            views = [j for j in views if held[j] > 0]
            trained = ("fw", "bw") if grads.runs[i] and grads.weights[i] else ("fw",)
            bias = _bias(seq, i, kind, held[i])
            cast(i, weights * (held[i] - bias), trained)  # weight and bias, apart
            cast(i, weights * bias, trained)
            for j in views:
                cast(i, weights * held[j], ("fw", "bw") if grads.weights[j] else ("fw",))
            if activations:  # the fp32 activations it reads
                for j in producers:
                    if of[j] == FP32_OUT and j not in skip:
                        cast(i, numel[j], back)
        elif activations and of[i] == FP32_OUT and names[i] != "Cast":
            listed = names[i] in FP32_LIST  # autocast casts a half input up, its gradient back
            if listed and HALF_TYPE.get(precision) == "fp16" and names[i] in READ_IN_PLACE:
                continue  # PyTorch's half_to_float kernels read it, write its gradient: none
            # a half input: cast up, or promoted (its gradient cast back)
            for j in walked(i)[1]:
                if of[j] == HALF_OUT:
                    cast(i, numel[j], back if listed else back[1:])
    return out


def _cast_held(seq: OperatorSequence, precision: str) -> np.ndarray:
    """`[N]` parameters each node holds that autocast casts when a GEMM reads them: frozen
    weights in (or dequantised to) the half type it computes in are not (fp16 ones under bf16
    autocast are)."""
    held = seq.column("params")
    if seq.meta.get("frozen_weights") in ("nf4", HALF_TYPE.get(precision)):
        held = np.where(frozen_nodes(seq), 0.0, held)
    return held


def _walks(seq: OperatorSequence, kinds: list[str]
           ) -> Callable[[int], tuple[list[int], list[int]]]:
    """`_walk` of `seq`'s nodes, each walked once while `seq` is kept (a plan prices one
    sequence under many layouts and GPUs); `kinds`: `classify.classified(seq)`'s, as
    everywhere here."""
    kept = KEPT.get(("walks", seq), dict)

    def walked(i: int) -> tuple[list[int], list[int]]:
        if i not in kept:
            kept[i] = _walk(seq, kinds, i)
        return kept[i]
    return walked


def _walk(seq: OperatorSequence, kinds: list[str], i: int) -> tuple[list[int], list[int]]:
    """(the views node `i` reads through, the operators producing what they show)."""
    reads = seq.neighbours()[0]
    views, producers, todo, seen = [], [], list(reads.get(i, [])), set()
    while todo:
        j = todo.pop()
        if j in seen:
            continue
        seen.add(j)
        if kinds[j] == "free":  # a view, of a weight perhaps
            views.append(j)
            todo.extend(reads.get(j, []))
        else:
            producers.append(j)
    return views, producers


def _gemm_views(seq: OperatorSequence) -> dict[int, list[int]]:
    """The views each GEMM or convolution of `seq` reads through (`_walk`), kept while `seq`
    is (a plan prices its weights' copies under every layout)."""
    from mdot_jax.gpu.classify import classified

    def views() -> dict[int, list[int]]:
        kinds = [k for k, _, _ in classified(seq)]
        walked = _walks(seq, kinds)
        return {i: walked(i)[0] for i, k in enumerate(kinds) if k in GEMMS}
    return KEPT.get(("gemm views", seq), views)


def copied_weights(seq: OperatorSequence, precision: str, grads: Backward,
                   rerun: np.ndarray | None = None) -> float:
    """Elements of the half copies autocast makes of the weights GEMMs and convolutions read
    that live at a step's peak: a trained fp32 weight's is kept in autocast's cache through the
    whole forward (checkpointed or not); a frozen fp32 weight's is made for each GEMM and kept
    only where autograd saves it for the input's gradient, in a node not run again (`rerun`:
    `[N] bool` those full checkpointing recomputes); frozen weights held in the half type or
    in 4 bits have none (`_cast_held`), nor embeddings (a gather is no autocast operator)."""
    held = _cast_held(seq, precision)
    again = rerun if rerun is not None else np.zeros(seq.num_ops, bool)
    trained: dict[int, float] = {}  # a holder's weights, cached once a tensor
    frozen = 0.0
    for i, views in _gemm_views(seq).items():
        saved = grads.data[i] and not again[i]  # a frozen weight's copy: for dgrad
        for j in (i, *(v for v in views if held[v] > 0)):
            if grads.weights[j]:
                trained[j] = held[j]
            elif saved:
                frozen += held[j]
    # a trained weight several operators read (ALBERT's shared layers) is one tensor, copied
    # once: each holder but one of those sharing a parameter taken off (`shared_params`)
    # (a sequence converted before it was recorded: at most the trained parameters)
    for readers in seq.meta.get("shared_params") or ():
        if counted := [trained.pop(j) for j in readers if j in trained]:
            trained[readers[0]] = max(counted)
    return float(min(sum(trained.values()), trainable(seq)) + frozen)


def _bias(seq: OperatorSequence, i: int, kind: str, params: float) -> int:
    """The elements of the bias among GEMM or convolution `i`'s `params` (0: none)."""
    if seq.config[i, _C["n_param_inputs"]] < 2:
        return 0
    n = int(seq.config[i, _C["out_channels" if kind == "conv" else "mm_n"]])
    return n if n < params else 0


def dequantised(seq: OperatorSequence, grads: Backward, gpu: GPU, precision: str
                ) -> list[tuple[int, str, str, tuple, GPU, float]]:
    """QLoRA's kernels (`frozen_weights` nf4, `autograd.quantized`): each 4-bit weight
    dequantised to the compute type for its GEMM in the forward, and again for its data
    gradient in the backward; a unary kernel over as many elements as move its bytes (half a
    byte read an element, the compute type's written)."""
    width = 2.0 if precision in HALF else 4.0
    return [(i, phase, "addu", (1, round(n * (NF4_BYTES + width) / (2 * width))), gpu, 1.0)
            for i, (_, n) in quantized(seq).items()
            for phase in (("fw", "bw") if grads.data[i] else ("fw",))]


def fp8_casts(linears: list[tuple[int, tuple]], gpu: GPU
              ) -> list[tuple[int, str, str, tuple, GPU, float]]:
    """The kernels FP8 training adds around each linear layer (node, its GEMM's (1, M, N, K)):
    its input and weight in the forward and its output's gradient in the backward, each
    scaled by its absolute maximum (a reduction) and cast to FP8 with a transposed copy for the
    other GEMM (one kernel), as Transformer Engine and torchao's float8 do per tensor."""
    out = []
    for i, (_, m, n, k) in linears:
        for phase, size in (("fw", m * k), ("fw", k * n), ("bw", m * n)):
            out += [(i, phase, "addu", (1, int(size)), gpu, 1.0)] * 2
    return out
