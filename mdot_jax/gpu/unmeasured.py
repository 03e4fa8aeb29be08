"""What a spec-sheet price (`spec_sheet.price`) says it priced without a measurement of its
like: operators priced as copies, convolutions unlike the measured ones, unaligned linear
layers, fused kernels and what backs their price."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from converters import OperatorSequence
from converters.attention import Block
from converters.sequence import CONFIG_FIELDS
from converters.vocab import UNK
from mdot_jax.gpu import recurrent
from mdot_jax.gpu.fused import ON_CHIP_SCANS, masked

_C = {name: i for i, name in enumerate(CONFIG_FIELDS)}


class Found(Protocol):
    """What `spec_sheet.price` found priced without a measurement (its `_Found`)."""

    other: dict[str, int]  # types priced as copies: how many
    recurrent: dict[str, int]  # LSTM, GRU, RNN layers: how many
    odd_convs: int  # convolutions unlike the measured ones
    slowed: list[int]  # the unaligned features of each layer at the measured slowdown
    odd_layers: list[int]  # large unaligned layers' features


def unmeasured(seq: OperatorSequence, found: Found, unaligned: dict | None, blocks: list[Block],
               note: str, efficient: str) -> list[str]:
    """The warnings of what `found` priced without a measurement of its like (`note`,
    `efficient`: what backs the flash and the memory-efficient attention kernels' price)."""
    said = []
    if found.other:  # the converter's unknown types by their names
        other = {k: v for k, v in found.other.items() if k != UNK} | (
            seq.unknown_ops if UNK in found.other else {})
        said.append("no GPU measurements of " + ", ".join(
            f"{k} ({v})" for k, v in sorted(other.items())) + ": priced as copies")
    if found.recurrent:
        said.append(recurrent.said(found.recurrent))
    if found.odd_convs:
        n = found.odd_convs
        said.append(f"{n} convolution{'s are' if n > 1 else ' is'} not 3x3 stride-1 dense "
                    "(the only ones measured): extrapolated")
    if seq.unknown_ops:
        said.append("operators unknown to the converter (their FLOPs not counted): "
                    + ", ".join(f"{k} ({v})" for k, v in seq.unknown_ops.items()))
    odd = found.odd_layers
    if (slowed := found.slowed) and unaligned:
        said.append(f"{len(slowed)} linear layer{'s' * (len(slowed) > 1)} with features not a "
                    "multiple of 16 bytes (" + ", ".join(
                        f"{n:,}" for n in sorted(set(slowed), reverse=True)[:3]) +
                    f"): at the {unaligned['gpu']}'s measured slowdown of such GEMMs")
    elif odd:
        said.append(f"{len(odd)} large linear layer{'s' * (len(odd) > 1)} with features not a "
                    f"multiple of 16 bytes ({max(odd):,}): cuBLAS runs their GEMMs with "
                    "narrower loads, slower than priced here (not measured yet); features "
                    "padded to a multiple of 64 avoid it")
    scans = int(np.isin(seq.op_names, list(ON_CHIP_SCANS)).sum())
    if scans:
        said.append(f"{scans} chunked scans priced as fused kernels: GEMMs of their FLOPs "
                    f"(the backward twice the forward's), {note}")
    if blocks:
        given, local = (sum(masked(b, int(seq.config[b.scores, _C["mm_n"]])) for b in blocks),
                        sum(b.local and b.window > 0 for b in blocks))
        said.append(f"{len(blocks)} attention block{'s' * (len(blocks) > 1)} priced as "
                    "fused kernels "
                    f"({sum(b.causal for b in blocks)} causal): the batched GEMMs of "
                    f"FlashAttention's forward and backward, {note}" + (
                        f"; {given} given a mask (a sliding window the sequence reaches, "
                        "the batch's padding, a learned bias): SDPA's memory-efficient kernel "
                        f"over every key, {efficient} (attention flash_attention_2 takes the "
                        "window and the padding itself; given a learned bias, measured on an "
                        "H100: docs/studies/whole-layers.md)" if given else "") + (
                        f"; {local} with a sliding window, the flash-attn package's: over the "
                        "window's keys alone" if local else "") + (
                        f"; {len(joined)} looped over a split's pieces (windows, images) as "
                        f"{len({b.call for b in joined})} varlen calls of the flash-attn "
                        "package, one a loop" if (joined := [b for b in blocks if b.call >= 0])
                        else ""))
    return said
