"""The optimizer's update as the kernels that run it, counted in passes: elementwise kernels
over all parameters in fp32, each reading two and writing one (12 bytes a parameter).

- torch.optim's default (foreach) kernels (`FOREACH`): one kernel a pass; `sgd` is SGD with
  momentum (buffer scale, add, parameter add), as timm's benchmarks and `mdot profile` train;
  under fp16 the gradient scaler's unscaling pass besides.
- torch.optim's fused kernels (`fused=True`; transformers' Trainer's default, `adamw_torch_fused`,
  from PyTorch 2.8; `FUSED`): the whole update in one kernel that reads p, g, m, v and writes p,
  m, v (Adam: 28 bytes a parameter, 7 / 3 passes; SGD with momentum 5 / 3), the gradient
  scaler's unscaling inside it.
- Megatron-LM's (`MEGATRON`): the half gradient into the fp32 main gradient (0.5), unscaled
  with the inf check (0.7), apex's fused optimizer (Adam 2.3; SGD with momentum 1.7), the
  parameters' half copy (0.5).
- bitsandbytes' 8-bit AdamW (`adamw-8bit`; transformers' `adamw_bnb_8bit`, `paged_adamw_8bit`;
  `PER_TENSOR`): one blockwise kernel a parameter tensor, launched in a Python loop, that reads
  p, g and the two one-byte states and writes p and the states (16 bytes a parameter, 4 / 3
  passes); under fp16 the gradient scaler's unscaling pass besides.

Gradient clipping by the total norm (`torch.nn.utils.clip_grad_norm_`, transformers' Trainer's
default; Megatron-LM's `clip_grad`), before the update, over every trained parameter's
gradient (`CLIP`): a norm that reads each gradient (a third of a pass), the norms' stack, total,
coefficient and clamp (four scalar kernels), and a scale that reads and writes each (two thirds).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

FOREACH = {"sgd": 3, "adam": 7, "adamw": 8}
FUSED = {"sgd": 5 / 3, "adam": 7 / 3, "adamw": 7 / 3}
MEGATRON = {"sgd": 3, "adam": 4, "adamw": 4}
PER_TENSOR = {"adamw-8bit": 4 / 3}  # a kernel a parameter tensor


@dataclass(frozen=True)
class Update:
    passes: float  # 12-byte elementwise passes over the parameters
    kernels: int  # launches
    what: str  # whose kernels, for the warning
    clip: bool = False  # gradients clipped by their total norm first (`CLIP`)
    per_tensor: bool = False  # `passes` in a kernel a parameter tensor (`kernels`: the rest)


CLIP = (1, 6)  # clipping's passes over every trained parameter, and its launches


def update(optimizer: str, precision: str, framework: str = "pytorch",
           fused: bool = False, clip: bool = False) -> Update:
    """The update of `optimizer` at `precision` as `framework` runs it (`fused`: torch.optim's
    fused kernels), after gradient clipping (`clip`)."""
    if optimizer == "muon":  # the parameters Muon does not take: AdamW's (`gpu.muon`)
        optimizer = "adamw"
    if optimizer not in (*FOREACH, *PER_TENSOR):
        raise ValueError(f"optimizer {optimizer!r}: choose from {sorted((*FOREACH, *PER_TENSOR))}")
    if optimizer in PER_TENSOR:
        if fused or framework != "pytorch":
            raise ValueError(f"optimizer {optimizer}: bitsandbytes' own kernels, under eager "
                             "PyTorch (no fused_optimizer, no framework megatron)")
        scaler = int(precision == "amp-fp16")
        u = Update(PER_TENSOR[optimizer] + scaler, scaler, "bitsandbytes' blockwise kernel a "
                   "parameter tensor", per_tensor=True)
    elif framework == "megatron":
        u = Update(MEGATRON[optimizer], MEGATRON[optimizer],
                   "Megatron-LM's fused optimizer and copies")
    elif fused:
        u = Update(FUSED[optimizer], 1, "torch.optim's fused kernel")
    else:
        passes = FOREACH[optimizer] + (precision == "amp-fp16")
        u = Update(passes, passes, "torch.optim's foreach kernels; fused_optimizer: its fused "
                                   "one, transformers' Trainer's default")
    return replace(u, what=f"{u.what}; after clipping, {CLIP[0]} pass in {CLIP[1]} kernels",
                   clip=True) if clip else u


def update_kernels(u: Update, rest: int, params: int, add_ms: Callable[[int], float],
                   tensors: int = 1) -> list[float]:
    """ms of each of the update's kernels: clipping's over all `params` where `u` clips
    (`CLIP`), then `u`'s passes over `rest` of them (all but what Muon takes), per tensor of
    `tensors` equal ones where `u` runs a kernel a tensor; `add_ms(n)`: one elementwise add
    over n fp32 values (a 12-byte pass)."""
    ks = [add_ms(params) * CLIP[0] / CLIP[1]] * CLIP[1] if u.clip else []
    if rest <= 0:
        return ks
    if u.per_tensor:  # the scaler's foreach passes, then a kernel a tensor
        tensors = max(1, min(tensors, rest))
        return ks + [add_ms(rest)] * u.kernels \
            + [add_ms(rest // tensors) * (u.passes - u.kernels)] * tensors
    return ks + [add_ms(rest) * u.passes / u.kernels] * u.kernels
