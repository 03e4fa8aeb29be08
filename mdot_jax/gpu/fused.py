"""Fused kernels whose intermediates stay on chip, priced as GEMMs of their FLOPs that write
nothing large (`tensor_cores.cube`), at the share of the peak fused attention reaches
(`tensor_cores.fused_attention_share`; `spec_sheet.price` applies it).

- FlashAttention-2, as PyTorch's scaled_dot_product_attention runs it (`fused_attention`): the
  forward's scores (Q K^T) and output (P V), the backward's five (the scores again,
  dP = dO V^T, dV, dQ, dK); a causal block computes only the tiles on and below the diagonal:
  half the keys. A block with a sliding window its keys reach, or with the batch's padding
  mask (`Block.padded`), is given transformers' mask (`attn_mask`), as a block with a learned
  bias (`Block.biased`) is given its bias; FlashAttention takes neither: SDPA's
  memory-efficient kernel runs it over every key, with the mask made additive in the query's
  type, a copy each call that the kernel keeps for its backward (`mask_bytes`).
  The flash-attn package (`Block.local`) takes the window itself: the keys within it alone, no
  mask (and the batch unpadded by transformers).
- scans whose matrix products stay on chip (`ON_CHIP_SCANS`: Mamba-2's chunked scan,
  `converters.state_space`): the forward once, the backward twice (`scan_gemms`).
- the pieces of a tensor our exporter's fused kernels read where they lie (`read_in_place`:
  the splits of Mamba-2's projected input), views, no copy.

`fused_nodes`: which blocks a step prices as fused kernels, and the nodes those kernels hold.
"""

from __future__ import annotations

import numpy as np

from converters import OperatorSequence
from converters.attention import Block, attention_blocks, needed, varlen
from converters.sequence import CONFIG_FIELDS, LOAD_FIELDS
from converters.state_space import OWN_OPS
from mdot_jax.gpu import tensor_cores

# an operator type -> its passes, each a GEMM of the forward's FLOPs
ON_CHIP_SCANS = {"ChunkScan": ("fw", "bw", "bw")}
_C = {name: i for i, name in enumerate(CONFIG_FIELDS)}
_WRITTEN = LOAD_FIELDS.index("bytes_written")


def fused_attention(seq: OperatorSequence, block: Block, *others: Block
                    ) -> dict[str, list[tuple]]:
    """The GEMMs (b, m, n, k) that price `block`'s fused attention kernel, by phase (module
    docstring); with `others`, the one kernel that runs them all (`attention.varlen`)."""
    work = 0
    for one in (block, *others):
        c = seq.config[one.scores]
        b, m, k, n = (max(int(c[_C[f]]), 1) for f in ("mm_batch", "mm_m", "mm_k", "mm_n"))
        keys = n
        if one.causal and not masked(one, n):  # the causal half, or the window's keys
            keys = max(int(n * needed(one, n)) if one.local else n // 2, 1)
        work += b * m * keys * k
    gemm = tensor_cores.cube(work)  # 2 work FLOPs a GEMM
    return {"fw": [gemm] * 2, "bw": [gemm] * 5}


def masked(block: Block, keys: int) -> bool:
    """Whether `block` (`keys` a query) runs with a mask tensor: a sliding window its keys
    reach or the batch's padding (transformers passes SDPA the mask then, not `is_causal`),
    unless its kernel takes the window and the padding itself (`Block.local`: the flash-attn
    package, to which transformers hands the unpadded tokens); or a learned bias (Swin's,
    BEiT's relative positions, T5's), which SDPA is given as its mask."""
    return (0 < block.window <= keys or block.padded) and not block.local or block.biased


def mask_bytes(seq: OperatorSequence, block: Block) -> float:
    """The fp32 bytes of the mask tensor `block` is given where it runs `masked` (the largest
    output entering its scores-to-softmax path from outside it), else 0."""
    if not masked(block, int(seq.config[block.scores, _C["mm_n"]])) or not len(seq.edges):
        return 0.0
    src, dst = seq.edges[:, 0], seq.edges[:, 1]
    inner = np.isin(dst, block.inner) & ~np.isin(src, block.inner) & (dst != block.scores)
    return float(seq.load[src[inner], _WRITTEN].max(initial=0.0))


def scan_gemms(op_type: str, fwd_flops: float) -> list[tuple[str, tuple]]:
    """(phase, GEMM dims) that price a scan of `ON_CHIP_SCANS` of `fwd_flops` forward FLOPs."""
    one = tensor_cores.cube(fwd_flops / 2)
    return [(phase, one) for phase in ON_CHIP_SCANS[op_type]]


def read_in_place(seq: OperatorSequence) -> set[int]:
    """The Slices and Splits of `seq` whose every consumer is one of our exporter's fused
    kernels (`converters.state_space.OWN_OPS`), which read them where they lie."""
    own = np.isin(seq.op_names, OWN_OPS)
    if not own.any() or not len(seq.edges):
        return set()
    src, dst = seq.edges[:, 0], seq.edges[:, 1]
    by_own, by_other = np.zeros(seq.num_ops, bool), np.zeros(seq.num_ops, bool)
    by_own[src[own[dst]]] = True
    by_other[src[~own[dst]]] = True
    piece = np.isin(seq.op_names, ("Slice", "Split"))
    return {int(i) for i in np.flatnonzero(piece & by_own & ~by_other)}


def fused_nodes(seq: OperatorSequence, attention: str, megatron: bool,
                blocks: list[Block] | None) -> tuple[list[Block], set[int]]:
    """(the attention blocks priced as fused kernels, the nodes fused kernels hold): a
    FlashAttention block whole; Megatron's fused scale-mask-softmax all of an eager block but
    its two GEMMs, its softmax and its dropout; the pieces our fused kernels read in place;
    what a varlen call's loop split and joined (`attention.varlen`)."""
    if blocks is None and (attention == "flash" or megatron):
        blocks = attention_blocks(seq)
    found = blocks or []
    blocks = found if attention == "flash" else []
    inside = {i for b in blocks for i in b.inner}
    inside |= varlen(seq, [b for b in blocks if b.call >= 0])[1]  # what its loop split, joined
    if megatron and attention != "flash":
        inside = {i for b in found for i in b.inner
                  if i not in (b.scores, b.softmax, b.output) and seq.op_names[i] != "Dropout"}
    return blocks, inside | read_in_place(seq)
