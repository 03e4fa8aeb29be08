"""Kernels of an eager PyTorch training step that its exported graph does not show as they run
(`gpu.spec_sheet` prices them where the step model says `dispatcher_kernels`), each read from
PyTorch's own code and checked against the aten operators a step dispatches:

- nn.Linear's bias is added inside its GEMM: `at::linear` calls `addmm` for a contiguous input
  (cuBLASLt's bias epilogue), so the exported MatMul + Add(bias) is one forward kernel; the
  backward still reduces the output's gradient into the bias's.
- under autocast a GEMM's bias is cast to the half type by a kernel of its own (and its
  gradient back), as the weight is.
- a training-mode batch norm increments its `num_batches_tracked`: a kernel of one element.
"""

from __future__ import annotations

from converters import OperatorSequence
from converters.sequence import CONFIG_FIELDS, LOAD_FIELDS
from mdot_jax.gpu.catalog import GPU

_C = {name: i for i, name in enumerate(CONFIG_FIELDS)}
_L = {name: i for i, name in enumerate(LOAD_FIELDS)}


def linear_biases(seq: OperatorSequence) -> dict[int, int]:
    """{Add node: its MatMul node} for each nn.Linear bias added inside the GEMM: an Add whose
    only operator input is a MatMul it alone reads, that MatMul reading a weight through its
    transpose (nn.Linear's W^T) and an activation no transpose produced (a contiguous one), the
    Add's one parameter as wide as the MatMul's output."""
    preds, succs = seq.neighbours()
    names = seq.op_names
    out = {}
    for i in map(int, (names == "Add").nonzero()[0]):
        mm = preds.get(i, [])
        if len(mm) != 1 or names[mm[0]] != "MatMul" or succs.get(mm[0]) != [i] or \
                seq.config[i, _C["n_param_inputs"]] != 1:
            continue
        m = mm[0]
        weights = [j for j in preds.get(m, []) if names[j] == "Transpose"
                   and seq.load[j, _L["params"]] > 0 and j not in preds]  # read, not computed
        data = [j for j in preds.get(m, []) if j not in weights]
        if len(weights) == 1 and not any(names[j] == "Transpose" for j in data) and \
                int(seq.load[i, _L["params"]]) == int(seq.config[m, _C["mm_n"]]):
            out[i] = m
    return out


def bias_casts(seq: OperatorSequence, biases: dict[int, int], gpu: GPU
               ) -> list[tuple[int, str, str, tuple, GPU, float]]:
    """Autocast's cast of each GEMM's bias, forward and back, as `spec_sheet.price` lists
    work: the fused Linear biases (`linear_biases`) and each Gemm's third input (the weight's
    cast, `autocast.casts`, counts its elements already: one more kernel)."""
    out = []
    for i, name in enumerate(seq.op_names):
        if i in biases:
            n = int(seq.load[i, _L["params"]])
        elif name == "Gemm" and seq.config[i, _C["n_param_inputs"]] >= 2:
            n = int(seq.config[i, _C["mm_n"]])
        else:
            continue
        out += [(i, phase, "addu", (1, max(n, 1)), gpu, 1.0) for phase in ("fw", "bw")]
    return out


def counters(seq: OperatorSequence, gpu: GPU) -> list[tuple[int, str, str, tuple, GPU, float]]:
    """Each training-mode batch norm's `num_batches_tracked.add_(1)`, in the forward."""
    c = seq.config
    return [(int(i), "fw", "addu", (1, 1), gpu, 1.0) for i in (
        (seq.op_names == "BatchNormalization") & (c[:, _C["training_mode"]] > 0)).nonzero()[0]]
