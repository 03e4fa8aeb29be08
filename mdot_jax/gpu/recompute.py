"""Full activation checkpointing of a transformer's layers (`torch.utils.checkpoint` around
every block, as FSDP and Megatron's `--recompute-granularity full` do), wrapped around one
GPU's step priced from its spec sheet.

The rules: the layers are the attention blocks (`converters.attention`); each keeps only its
input (the hidden state, the size of its attention output) through the forward, and the
backward runs each layer's forward again before its own backward (`phases["recomputation"]`
= the forward's time); at a time one layer's activations are alive, a 1/L share of all. Not
measured: the rules are PyTorch's, the time is the forward's price.
"""

from __future__ import annotations

from converters.attention import attention_blocks
from converters.sequence import CONFIG_FIELDS, OperatorSequence
from mdot_jax.errors import RequestError
from mdot_jax.serving.memory import HALF, step_memory
from mdot_jax.serving.prediction import Prediction

_OUT_NUMEL = CONFIG_FIELDS.index("out_numel")


def checkpoint_layers(p: Prediction, seq: OperatorSequence, precision: str,
                      optimizer: str) -> Prediction:
    """`p` (one GPU's step of `seq`, with its phases) with every layer checkpointed."""
    blocks = attention_blocks(seq)
    if not blocks:
        raise RequestError("activation_checkpointing: no transformer layers (attention "
                           "blocks) found in the model to checkpoint", "activation_checkpointing")
    width = 2.0 if precision in HALF else 4.0
    boundaries = width * float(sum(seq.config[b.output, _OUT_NUMEL] for b in blocks))
    activations = step_memory(seq, precision, optimizer).activations
    kept = activations / len(blocks) + boundaries
    phases = dict(p.phases, recomputation=p.phases.get("forward", 0.0))
    note = (f"activation checkpointing over {len(blocks)} layers: the forward run again in the "
            f"backward ({phases['recomputation']:.3g} ms), activations {activations / 1e9:.3g}"
            f" -> {kept / 1e9:.3g} GB (PyTorch's rules, not measured)")
    return p.with_phases(phases, memory_gb=p.memory_gb - max(activations - kept, 0.0) / 1e9,
                         warnings=[*p.warnings, note])
