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
"""

from __future__ import annotations

from dataclasses import dataclass

FOREACH = {"sgd": 3, "adam": 7, "adamw": 8}
FUSED = {"sgd": 5 / 3, "adam": 7 / 3, "adamw": 7 / 3}
MEGATRON = {"sgd": 3, "adam": 4, "adamw": 4}


@dataclass(frozen=True)
class Update:
    passes: float  # 12-byte elementwise passes over the parameters
    kernels: int  # launches
    what: str  # whose kernels, for the warning


def update(optimizer: str, precision: str, framework: str = "pytorch",
           fused: bool = False) -> Update:
    """The update of `optimizer` at `precision` as `framework` runs it (`fused`: torch.optim's
    fused kernels)."""
    if optimizer == "muon":  # the parameters Muon does not take: AdamW's (`gpu.muon`)
        optimizer = "adamw"
    if optimizer not in FOREACH:
        raise ValueError(f"optimizer {optimizer!r}: choose from {sorted(FOREACH)}")
    if framework == "megatron":
        return Update(MEGATRON[optimizer], MEGATRON[optimizer],
                      "Megatron-LM's fused optimizer and copies")
    if fused:
        return Update(FUSED[optimizer], 1, "torch.optim's fused kernel")
    passes = FOREACH[optimizer] + (precision == "amp-fp16")
    return Update(passes, passes, "torch.optim's foreach kernels; fused_optimizer: its fused "
                                  "one, transformers' Trainer's default")
