"""Activation checkpointing of a transformer's layers, wrapped around one GPU's step priced
from its spec sheet.

`full` (`torch.utils.checkpoint` around every block, as FSDP and Megatron's
`--recompute-granularity full` do): the layers are the attention blocks
(`converters.attention.layers`: a decoder's cross-attention is part of its layer); each keeps
only its input (the hidden state, the size of its attention output) through the forward, and
the backward runs each layer's forward again before its own backward
(`phases["recomputation"]` = the layers' forward time); at a time one layer's activations are
alive, a 1/L share of the layers'. What lies outside the layers (the embedding, the final
norm, the head and the loss: `converters.attention.in_layers`) is neither run again nor
freed; nor is a layer where autograd runs no backward (all its parameters frozen and none
trained before it: nothing recorded for a checkpoint to run again, no input kept).

`selective` (Megatron's `--recompute-granularity selective`): only the attention core (the
scores, softmax, dropout and what lies between them and the output MatMul) is run again, so
its S x S tensors are not kept; a fused attention keeps none anyway, and then nothing changes.
`rerun` names the nodes run again; `spec_sheet.price` prices their forward kernels once more,
issued by the host like any other (phase `recomputation`), and `checkpoint_layers` the memory.
Not measured: the rules are PyTorch's and Megatron's, the time the forward's price.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from converters.attention import Block, layer_starts
from converters.sequence import OperatorSequence
from mdot_jax.errors import RequestError
from mdot_jax.gpu.model_parallel import checkpointed, full_checkpoint_bytes
from mdot_jax.serving.memory import activation_scale, autocast_copies, saved
from mdot_jax.serving.prediction import Prediction


def rerun(seq: OperatorSequence, granularity: str, blocks: list[Block],
          fused: list[Block]) -> set[int]:
    """The nodes whose forward kernels run again in the backward (`spec_sheet.price`'s
    `recompute`): every one (`full`), or the attention cores of `blocks` unless fused."""
    if not layer_starts(seq, blocks):
        raise RequestError("activation_checkpointing: no transformer layers (attention "
                           "blocks) or stack of layers found in the model to checkpoint",
                           "activation_checkpointing")
    if granularity == "full":  # the layers' operators (not the embedding, head or loss)
        return set(np.flatnonzero(checkpointed(seq, blocks)[0]).tolist())
    if not blocks:
        raise RequestError("activation_checkpointing 'selective': it runs attention cores "
                           "again, and the model has none (full checkpoints its layers)",
                           "activation_checkpointing")
    return set() if fused else _cores(blocks)


def _cores(blocks: list[Block]) -> set[int]:
    """The attention cores: each block's nodes but its output MatMul."""
    return {i for b in blocks for i in b.inner if i != b.output}


def copies_kept(seq: OperatorSequence, precision: str, framework: str,
                granularity: str | None, blocks: list[Block]) -> float:
    """Bytes of autocast's weight copies a step keeps at its peak checkpointed at
    `granularity` (None: not checkpointed; full: none of a frozen weight's in the layers it
    runs again)."""
    rerun = checkpointed(seq, blocks)[0] if granularity == "full" else None
    return autocast_copies(seq, precision, framework, rerun)


def checkpoint_layers(p: Prediction, seq: OperatorSequence, precision: str,
                      granularity: str, fused: list[Block], blocks: list[Block],
                      framework: str = "pytorch") -> Prediction:
    """`p` (one GPU's step of `seq` priced with `rerun`'s nodes recomputed; `fused`: its
    attention blocks priced as fused kernels) with the memory of every layer (`blocks`)
    checkpointed at `granularity`, and a note."""
    scale = activation_scale(precision)
    again = p.phases.get("recomputation", 0.0)  # ms
    if granularity == "selective":
        if fused:  # said: the user asked for something that changes nothing here
            return dataclasses.replace(p, warnings=[
                *p.warnings, f"selective activation checkpointing changes nothing: the "
                f"{len(fused)} attention blocks run as fused kernels, which keep no S x S "
                "tensors to free (full checkpoints the layers)"])
        core = sorted(_cores(blocks))
        freed = float(saved(seq, (), scale)[core].sum())
        note = (f"selective activation checkpointing over {len(layer_starts(seq, blocks))} "
                f"layers: the attention core run again in the backward ({again:.3g} ms), "
                f"{freed / 1e9:.3g} GB of its tensors not kept (Megatron's rules, not measured)")
        return dataclasses.replace(p.with_memory(activations=-freed / 1e9),
                                   warnings=[*p.warnings, note])
    each = saved(seq, fused, scale, framework=framework)  # [N] bytes kept of each output
    held, layer, count = full_checkpoint_bytes(seq, blocks, each, scale,
                                               np.zeros(seq.num_ops, int), 1)
    # frozen fp32 weights' autocast copies kept for a layer's backward are not kept either
    copies = autocast_copies(seq, precision, framework) - copies_kept(
        seq, precision, framework, granularity, blocks)
    activations, kept = float(each.sum()) + copies, float(held[0] + layer[0])
    note = (f"activation checkpointing over {count[0]} layers: the forward run again in the "
            f"backward ({again:.3g} ms), activations {activations / 1e9:.3g}"
            f" -> {kept / 1e9:.3g} GB (PyTorch's rules, not measured)")
    return dataclasses.replace(p.with_memory(activations=-max(activations - kept, 0.0) / 1e9),
                               warnings=[*p.warnings, note])
