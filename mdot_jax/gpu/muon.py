"""torch.optim.Muon's update (`optimizer="muon"`), as `spec_sheet.price` prices it; not measured.

- which parameters: every trained hidden weight matrix (a linear layer's [K, N] weight, not the
  embedding's or the output head's: `autograd.hidden_weights`), as Muon's authors use it and
  torch.optim.Muon takes (2-D parameters only); every other trained parameter by AdamW
  (`gpu.update`: torch.optim's kernels), as Muon is paired.
- each matrix [A, B] (A <= B; transposed otherwise), one after another (torch.optim.Muon loops
  over its parameters, `_single_tensor_muon`): the momentum's and Nesterov's blends, the cast
  to bf16, the norm, its clamp and the division, then the weight decay and the update
  (`ELEMENTWISE` kernels, each priced as an elementwise pass over the matrix), and between
  them `NS_STEPS` Newton-Schulz steps in bf16 of three GEMMs each (the Gram matrix
  X X^T, A x A x B; its square added scaled, A x A x A, one `addmm`; that times X added, A x B
  x A, one `addmm`), at the tensor-core peak's measured share where the step model holds it.
- memory: a momentum buffer a matrix parameter (4 bytes, where AdamW keeps 8).
"""

from __future__ import annotations

from converters import OperatorSequence
from mdot_jax.autograd import hidden_weights
from mdot_jax.gpu import peaks
from mdot_jax.gpu.catalog import GPU
from mdot_jax.gpu.gpu_ops import StepModel

NS_STEPS = 5
ELEMENTWISE = 8  # lerp_, lerp, bfloat16, norm, clamp, div_ | mul_ (decay), add_: a matrix's
BEFORE = 6  # of those, before the Newton-Schulz GEMMs


def matrices(seq: OperatorSequence) -> list[tuple[int, int]]:
    """(A, B), A <= B, of each trained hidden weight matrix Muon updates."""
    return [(min(k, n), max(k, n)) for _, k, n in hidden_weights(seq, frozen=False).values()]


def kernels_ms(shapes: list[tuple[int, int]], gpu: GPU, model: StepModel, streamed: bool
               ) -> list[float]:
    """ms of each kernel Muon's update of `shapes` runs, in order (module docstring);
    `streamed`: behind a host that issues them (`StepModel.kernel_ms`)."""
    if not shapes:
        return []
    precision = "amp-bf16" if gpu.tflops.get("bf16") else "fp32"  # else no bf16 arithmetic
    at, _ = peaks.seen_by_class(gpu, precision, model.info.get("tensor_cores", {}).get(
        gpu.name, ()))
    tc = peaks.tensor_core_gemms(model.info, gpu, precision)
    out: list[float] = []
    for a, b in shapes:
        gemms = [(1, a, a, b), (1, a, a, a), (1, a, b, a)]
        ms = tc[1].ms(tc[0], ["linear"] * 3, gemms, [at["gemm"]] * 3) if tc else \
            model.kernel_ms(["linear"] * 3, gemms, [at["gemm"]] * 3, streamed)
        pass_ms = float(model.kernel_ms(["add"], [(1, a * b)], [at["fp32"]], streamed)[0])
        out += [pass_ms] * BEFORE + [float(t) for t in ms] * NS_STEPS \
            + [pass_ms] * (ELEMENTWISE - BEFORE)
    return out


def said(shapes: list[tuple[int, int]], rest: int) -> str:
    """The warning of Muon's pricing."""
    if not shapes:
        return (f"optimizer muon: no trained hidden weight matrix (a linear layer's 2-D weight, "
                f"not the embedding's or the head's; convolutions' are 4-D) for torch.optim.Muon:"
                f" AdamW over all {rest:,} parameters, as Muon is paired: not measured")
    return (f"the muon update priced as torch.optim.Muon's over {len(shapes):,} weight matrices "
            f"({sum(a * b for a, b in shapes):,} parameters, one matrix after another: "
            f"{NS_STEPS} Newton-Schulz steps of 3 bf16 GEMMs each and {ELEMENTWISE} "
            "elementwise passes)" + (f", AdamW over the other {rest:,}" if rest else "")
            + ": not measured")
