"""Model-level aggregates of an operator sequence: what the tree model (`models.trees`)
reads. Workload and graph totals, log operator counts by type, depth, the convolution
breakdowns, and where the sequence carries predicted operator times, their breakdown by kind
of work."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from converters.sequence import CONFIG_FIELDS, OperatorSequence
from converters.vocab import UNK_ID, VOCAB
from mdot_jax.data.dataset import OP_MS, Sample
from mdot_jax.data.features import conv_kinds, workload_raw

# 1: workload, graph totals, op counts, depth; 2: + the convolution breakdown by kernel class;
# 3: + the grouped-convolution breakdown (CHANGELOG.md; each version was kept by a rule set
# before its confirming runs: benchmarks/results/timm-rtx3090-fused-family-aggv3/README.md)
AGGREGATES_VERSION = 3
_KERNEL_H, _STRIDE_H, _GROUPS, _C_IN, _C_OUT = (CONFIG_FIELDS.index(f) for f in (
    "kernel_h", "stride_h", "groups", "in_channels", "out_channels"))


def conv_breakdown(seq: OperatorSequence) -> np.ndarray:
    """`[15]`: log FLOPs (forward + backward), log bytes and log count of the convolutions in
    five overlapping classes with their own kernels: 1x1, 3x3, larger, strided, depthwise."""
    load, kinds = seq.load.astype(np.float64), conv_kinds(seq)
    is_conv, kh = kinds.sum(axis=1) > 0, seq.config[:, _KERNEL_H]
    classes = (kh == 1, kh == 3, kh > 3, seq.config[:, _STRIDE_H] > 1, kinds[:, 1] > 0)
    return np.log1p([[load[m, 0:2].sum(), load[m, 2:4].sum(), m.sum()]
                     for m in (is_conv & c for c in classes)]).ravel()


def group_breakdown(seq: OperatorSequence) -> np.ndarray:
    """`[14]`, where the RTX 3090's channels-last slowdowns are (RegNet, ResNeSt, NFNet run
    2-3x slower than in NCHW, ConvMixer and TResNet more): log FLOPs (forward + backward)
    and log count of the grouped convolutions by channels per group (< 8, 8-31, 32-127,
    >= 128); log FLOPs of the depthwise ones by width (< 256, >= 256 channels) x kernel (3x3
    or smaller, larger); log FLOPs and count of the other convolutions whose channels are
    not a multiple of 8."""
    kinds, cfg = conv_kinds(seq), seq.config
    flops = seq.column("fwd_flops") + seq.column("bwd_flops")
    c_in, c_out = cfg[:, _C_IN], cfg[:, _C_OUT]
    per_group = c_in / np.maximum(cfg[:, _GROUPS], 1)
    depthwise, wide, big = kinds[:, 1] > 0, c_in >= 256, cfg[:, _KERNEL_H] > 3
    grouped = [(kinds[:, 2] > 0) & (per_group >= lo) & (per_group < hi)
               for lo, hi in ((0, 8), (8, 32), (32, 128), (128, np.inf))]
    unaligned = (kinds.sum(axis=1) > 0) & ~depthwise & ((c_in % 8 > 0) | (c_out % 8 > 0))
    out = [[flops[m].sum(), m.sum()] for m in grouped]
    out += [[flops[depthwise & (wide == w) & (big == k)].sum()]
            for w in (False, True) for k in (False, True)]
    out.append([flops[unaligned].sum(), unaligned.sum()])
    return np.log1p(np.concatenate(out))


_OP_GROUPS = {  # the predicted operator time of a graph, summed by kind of work
    "conv": ("Conv", "ConvTranspose"), "matmul": ("MatMul", "Gemm", "Einsum"),
    "norm": ("BatchNormalization", "LayerNormalization", "GroupNormalization",
             "InstanceNormalization"),
    "movement": ("Concat", "Split", "Slice", "Gather", "Pad", "Resize", "Transpose", "Reshape",
                 "Expand", "Tile"),
}


def op_time_breakdown(seq: OperatorSequence) -> np.ndarray:
    """`[len(_OP_GROUPS) + 1]`: log microseconds of predicted operator time by kind of work
    (the last: everything else, the elementwise operators)."""
    ms = np.asarray(seq.meta[OP_MS], np.float64)
    names = np.asarray(VOCAB)[seq.op_type]
    masks = [np.isin(names, ops) for ops in _OP_GROUPS.values()]
    rest = ~np.any(masks, axis=0)
    return np.log1p(1e3 * np.asarray([ms[m].sum() for m in [*masks, rest]]))


def aggregates(s: Sample, devices: Sequence[str], vocab_size: int = len(VOCAB),
               version: int = AGGREGATES_VERSION) -> np.ndarray:
    """`[F]` model-level features: workload and graph totals, log op counts by type, max depth
    (from version 2 the convolution breakdown, from 3 the grouped one), and where the
    sequence carries predicted operator times, their breakdown by kind of work. Op types newer than
    a model's `vocab_size` count as `<unk>` (F stays what it was fitted on)."""
    ids = np.where(s.seq.op_type < vocab_size, s.seq.op_type, UNK_ID)
    counts = np.bincount(ids, minlength=vocab_size)[:vocab_size]
    depth = s.seq.depths()[0].max() if s.seq.num_ops else 0
    parts = [workload_raw(s.workload, s.seq, devices), np.log1p(counts), [np.log1p(depth)]]
    if version >= 2:
        parts.append(conv_breakdown(s.seq))
    if version >= 3:
        parts.append(group_breakdown(s.seq))
    if OP_MS in s.seq.meta:  # op-grounded: predicted operator times (workload_raw: the total)
        parts.append(op_time_breakdown(s.seq))
    return np.concatenate(parts).astype(np.float32)
