"""Host-side features: operator sequence + workload -> normalised arrays, and padded batches.

Everything here is numpy with data-dependent shapes; only the padded `Batch` (bounded set of
shapes: fixed batch size, sequence length from `buckets`) goes to the device.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import dijkstra

from converters import CONFIG_FIELDS, LOAD_FIELDS, OperatorSequence
from converters.vocab import UNK_ID, VOCAB
from mdot_jax.data.dataset import OP_MS, Sample, Workload
from mdot_jax.options import FEATURE_PRECISION_OF, FEATURE_PRECISIONS, LAYOUTS, OPTIMIZERS

GRAPH_TOTALS = ("fwd_flops", "bwd_flops", "bytes", "params", "num_ops",
                "dense_conv_flops", "depthwise_conv_flops", "grouped_conv_flops")
# Derived per-operator columns appended to the configuration: the kind of convolution. The
# Raw groups / in_channels are in the configuration too, but a grouped (1 < groups < C_in)
# convolution behaves unlike both others (it can run slower in channels-last than in NCHW,
# where everything else runs faster), so each operator carries its kind explicitly rather
# than leaving it to a ratio of two normalised logs (docs/evaluation.md).
CONV_KINDS = ("conv_dense", "conv_depthwise", "conv_grouped")
MAX_DEPTH = 511  # depth embeddings clip here
FAR = 9  # graph-distance buckets: 0 (self) .. 8 hops, 9 = farther or unreachable
# a (log-scaled) feature that varies less than this over the training set is constant, not
# divided by float noise (which turned an unseen value into 1e5 standard deviations)
MIN_STD = 1e-3
EDGES_PER_OP = 4  # padded edge slots per operator (DenseNet-201 has 3.5)
_CONV_IDS = [VOCAB.index("Conv"), VOCAB.index("ConvTranspose")]
_GROUPS, _C_IN = CONFIG_FIELDS.index("groups"), CONFIG_FIELDS.index("in_channels")


@dataclass(frozen=True)
class FeatureConfig:
    """Which positional features to compute (host side) and how to pad."""

    lap_dim: int = 8  # Laplacian eigenvectors
    rw_dim: int = 8  # random-walk landing probabilities
    distances: bool = False  # [T, T] graph-distance buckets for the attention bias
    buckets: tuple[int, ...] = (64, 128, 256, 512, 1024, 2048, 4096, 8192)
    group: int = 2  # K: workloads of one sequence per batch row (encoded once, read out K times)
    fused: int = 0  # eager-kernel fusion version of the sequences (converters.fusion); 0: none
    op_costs: bool = False  # sequences carry per-operator predicted ms (`kernels.cost_model`)


def sequences_fused(seqs) -> int:
    """The fusion version the operator sequences were converted with (0: unfused); a mix is
    an error (a model trained on one kind mispredicts the other)."""
    kinds = {seq.fusion for seq in seqs}
    if len(kinds) > 1:
        raise ValueError(f"the operator sequences mix fusion versions {sorted(kinds)} (0: "
                         "unfused; converters.fusion): convert them again one way")
    return kinds.pop() if kinds else 0


def sequences_op_costs(seqs) -> bool:
    """Whether the sequences carry per-operator predicted times; a mix is an error."""
    kinds = {OP_MS in seq.meta for seq in seqs}
    if len(kinds) > 1:
        raise ValueError("some operator sequences carry predicted operator times (op_ms) and "
                         "some do not: attach them to all or none")
    return kinds == {True}


def op_load(seq: OperatorSequence) -> np.ndarray:
    """`[N, L]` signed-log load, then (where the sequence carries them) the operator's
    predicted microseconds as a fourth per-operator dimension: `[N, L + 1]`."""
    load = _slog(seq.load)
    if OP_MS not in seq.meta:
        return load
    return np.concatenate([load, _slog(1e3 * np.asarray(seq.meta[OP_MS]))[:, None]], axis=1)


@dataclass
class FeatureStats:
    """Normalisation statistics, computed on the training split only (saved in checkpoints)."""

    config_mean: list
    config_std: list
    load_mean: list
    load_std: list
    workload_mean: list
    workload_std: list
    target_mean: float
    target_std: float
    devices: list = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def _slog(x: np.ndarray) -> np.ndarray:
    """Signed log1p: keeps -1 (axis) and 0 distinct and compresses 1e12 FLOPs to ~28."""
    return np.sign(x) * np.log1p(np.abs(x))


def conv_kinds(seq: OperatorSequence) -> np.ndarray:
    """`[N, 3] float32` one-hot over CONV_KINDS (zeros for operators that are not Conv or
    ConvTranspose): dense (groups 1), depthwise (groups = C_in), grouped (in between)."""
    is_conv = np.isin(seq.op_type, _CONV_IDS)
    groups, c_in = seq.config[:, _GROUPS], seq.config[:, _C_IN]
    depthwise = is_conv & (groups > 1) & (groups >= c_in)
    grouped = is_conv & (groups > 1) & ~depthwise
    return np.stack([is_conv & (groups <= 1), depthwise, grouped], axis=1).astype(np.float32)


def op_config(seq: OperatorSequence) -> np.ndarray:
    """`[N, CONFIG_DIM]`: the raw configuration, then the derived CONV_KINDS columns."""
    return np.concatenate([seq.config, conv_kinds(seq)], axis=1)


def graph_totals(seq: OperatorSequence) -> np.ndarray:
    """`[len(GRAPH_TOTALS)]` float64, then the summed predicted operator microseconds where
    the sequence carries them."""
    conv_flops = conv_kinds(seq).T.astype(np.float64) @ seq.column("fwd_flops")  # [3]
    op_ms = [1e3 * float(np.sum(seq.meta[OP_MS]))] if OP_MS in seq.meta else []
    return np.array([seq.total("fwd_flops"), seq.total("bwd_flops"), seq.total("bytes"),
                     seq.params, seq.num_ops, *conv_flops, *op_ms])


def workload_raw(w: Workload, seq: OperatorSequence, devices: Sequence[str]) -> np.ndarray:
    """`[W]`: log2 batch, log2 size, log graph totals, then one-hots (precision, layout,
    optimizer, device)."""
    numeric = [math.log2(w.batch_size), math.log2(max(w.input_size, 1))]
    numeric += _slog(graph_totals(seq)).tolist()
    onehots = [float(FEATURE_PRECISION_OF.get(w.precision) == p) for p in FEATURE_PRECISIONS]
    onehots += [float(w.layout == x) for x in LAYOUTS]
    onehots += [float(w.optimizer == o) for o in OPTIMIZERS]
    onehots += [float(w.device == d) for d in devices]
    return np.asarray(numeric + onehots, np.float32)


NUM_NUMERIC_WORKLOAD = 2 + len(GRAPH_TOTALS)


def fit_stats(samples: Sequence[Sample]) -> FeatureStats:
    """Mean/std of the transformed features over the (training) samples."""
    devices = sorted({s.workload.device for s in samples})
    seqs = {id(s.seq): s.seq for s in samples}.values()
    cfg = np.concatenate([_slog(op_config(q)) for q in seqs])
    load = np.concatenate([op_load(q) for q in seqs])
    wl = np.stack([workload_raw(s.workload, s.seq, devices) for s in samples])
    y = np.log(np.array([s.label_ms for s in samples]))

    def ms(a):
        std = a.std(axis=0)
        return a.mean(axis=0).tolist(), np.where(std > MIN_STD, std, 1.0).tolist()

    wl_mean, wl_std = ms(wl)
    k = NUM_NUMERIC_WORKLOAD + sequences_op_costs(seqs)  # one-hots stay 0/1
    wl_mean = wl_mean[:k] + [0.0] * (len(wl_mean) - k)
    wl_std = wl_std[:k] + [1.0] * (len(wl_std) - k)
    return FeatureStats(*ms(cfg), *ms(load), wl_mean, wl_std, float(y.mean()),
                        float(y.std() or 1.0), devices)


class SeqFeatures(NamedTuple):
    """One sequence's device-ready features (unpadded, host numpy). N operators."""

    op_type: np.ndarray  # [N] int32
    config: np.ndarray  # [N, CONFIG_DIM] float32, normalised: configuration + CONV_KINDS
    load: np.ndarray  # [N, L] float32, normalised; [N, L + 1] with predicted operator times
    pe: np.ndarray  # [N, P] float32: Laplacian (lap_dim) then random walk (rw_dim)
    depth: np.ndarray  # [N, 2] int32: depth, reverse depth (clipped to MAX_DEPTH)
    dist: np.ndarray | None  # [N, N] uint8 graph-distance buckets, or None
    edges: np.ndarray  # [E, 2] int32 (src, dst)


def seq_features(seq: OperatorSequence, stats: FeatureStats, fc: FeatureConfig) -> SeqFeatures:
    cfg = (_slog(op_config(seq)) - np.asarray(stats.config_mean)) / np.asarray(stats.config_std)
    if fc.op_costs != (OP_MS in seq.meta):
        raise ValueError(f"{seq.name}: the features expect op_costs={fc.op_costs}, the "
                         "sequence " + ("carries" if OP_MS in seq.meta else "lacks") +
                         " predicted operator times")
    load = (op_load(seq) - np.asarray(stats.load_mean)) / np.asarray(stats.load_std)
    pe = np.concatenate([seq.positional_encoding("laplacian", fc.lap_dim),
                         seq.positional_encoding("random_walk", fc.rw_dim)], axis=1)
    depth = np.minimum(np.stack(seq.depths(), axis=1), MAX_DEPTH).astype(np.int32)
    dist = distance_buckets(seq.num_ops, seq.edges) if fc.distances else None
    return SeqFeatures(seq.op_type.astype(np.int32), cfg.astype(np.float32),
                       load.astype(np.float32), pe, depth, dist, seq.edges.astype(np.int32))


def distance_buckets(n: int, edges: np.ndarray) -> np.ndarray:
    """`[n, n] uint8`: undirected hop distance, clipped to FAR (unreachable -> FAR)."""
    a = sp.csr_matrix((np.ones(len(edges)), (edges[:, 0], edges[:, 1])), shape=(n, n))
    d = dijkstra(a, directed=False, unweighted=True, limit=FAR - 1)
    return np.where(np.isfinite(d), d, FAR).astype(np.uint8)


class Batch(NamedTuple):
    """A padded device batch. B = batch size (fixed), T = bucket length.

    op_type [B,T] int32 (0 = padding), config [B,T,C], load [B,T,L], pe [B,T,P] float32,
    depth [B,T,2] int32, dist [B,T,T] uint8 (or [B,1,1] zeros when unused),
    mask [B,T] bool (real operators), senders/receivers [B,E] int32 with E = EDGES_PER_OP*T
    and edge_mask [B,E] bool (the DAG's edges, for graph baselines). K = `FeatureConfig.group`
    samples that share one sequence (e.g. the same model measured in two memory layouts) share
    a row: workload [B,K,W] float32, target [B,K] float32 (normalised log ms), weight [B,K]
    float32 (0 for padding).
    """

    op_type: np.ndarray
    config: np.ndarray
    load: np.ndarray
    pe: np.ndarray
    depth: np.ndarray
    dist: np.ndarray
    mask: np.ndarray
    senders: np.ndarray
    receivers: np.ndarray
    edge_mask: np.ndarray
    workload: np.ndarray
    target: np.ndarray
    weight: np.ndarray


def bucket_length(n: int, buckets: Sequence[int]) -> int:
    for b in buckets:
        if n <= b:
            return b
    raise ValueError(f"sequence of {n} operators is longer than the largest bucket "
                     f"{buckets[-1]}; add a bucket")


def bucket_batch_size(length: int, tokens: int, multiple: int = 1) -> int:
    """Batch size of a bucket: about `tokens` operators per batch (so long sequences come in
    small batches), a multiple of `multiple` (the device count), at least `multiple`."""
    return max(multiple, (tokens // length) // multiple * multiple)


def make_batch(feats: Sequence[SeqFeatures], workloads: Sequence[np.ndarray],
               targets: Sequence[np.ndarray], batch_size: int, length: int, group: int,
               use_dist: bool) -> Batch:
    """Pads `len(feats) <= batch_size` sequences to `[batch_size, length]`; row i's
    workloads `[k_i, W]` and targets `[k_i]` (k_i <= group) to `[group, ...]`."""
    k = len(feats)
    assert k <= batch_size and len(workloads) == len(targets) == k
    C, L, P = feats[0].config.shape[1], feats[0].load.shape[1], feats[0].pe.shape[1]
    T = length
    op = np.zeros((batch_size, T), np.int32)
    cfg = np.zeros((batch_size, T, C), np.float32)
    load = np.zeros((batch_size, T, L), np.float32)
    pe = np.zeros((batch_size, T, P), np.float32)
    depth = np.zeros((batch_size, T, 2), np.int32)
    dist = np.full((batch_size, T, T) if use_dist else (batch_size, 1, 1), FAR, np.uint8)
    mask = np.zeros((batch_size, T), bool)
    E = EDGES_PER_OP * T
    senders = np.zeros((batch_size, E), np.int32)
    receivers = np.zeros((batch_size, E), np.int32)
    edge_mask = np.zeros((batch_size, E), bool)
    for i, f in enumerate(feats):
        n = f.op_type.shape[0]
        op[i, :n], cfg[i, :n], load[i, :n], pe[i, :n], depth[i, :n] = \
            f.op_type, f.config, f.load, f.pe, f.depth
        mask[i, :n] = True
        if use_dist:
            dist[i, :n, :n] = f.dist
        m = f.edges.shape[0]
        if m > E:
            raise ValueError(f"a graph with {m} edges for {n} operators exceeds the "
                             f"{EDGES_PER_OP} edges per operator a batch holds")
        senders[i, :m], receivers[i, :m], edge_mask[i, :m] = f.edges[:, 0], f.edges[:, 1], True
    wl = np.zeros((batch_size, group, workloads[0].shape[1]), np.float32)
    tgt = np.zeros((batch_size, group), np.float32)
    weight = np.zeros((batch_size, group), np.float32)
    for i, (w, t) in enumerate(zip(workloads, targets)):
        wl[i, :len(w)], tgt[i, :len(t)], weight[i, :len(t)] = w, t, 1.0
    return Batch(op, cfg, load, pe, depth, dist, mask, senders, receivers, edge_mask, wl, tgt,
                 weight)


class FeatureCache:
    """Features of every sample: one `SeqFeatures` per distinct sequence, computed once."""

    def __init__(self, stats: FeatureStats, fc: FeatureConfig, vocab_size: int = len(VOCAB)):
        self.stats, self.fc, self.vocab_size = stats, fc, vocab_size
        # id(seq) -> (seq, features): holding the sequence keeps its id from being reused
        self._seqs: dict[int, tuple[OperatorSequence, SeqFeatures]] = {}

    def seq(self, seq: OperatorSequence) -> SeqFeatures:
        key = id(seq)
        if key not in self._seqs:
            f = seq_features(seq, self.stats, self.fc)
            # op types newer than the model's vocabulary (an older checkpoint) are <unk>
            self._seqs[key] = seq, f._replace(op_type=np.where(
                f.op_type < self.vocab_size, f.op_type, UNK_ID).astype(np.int32))
        return self._seqs[key][1]

    def workload(self, w: Workload, seq: OperatorSequence) -> np.ndarray:
        raw = workload_raw(w, seq, self.stats.devices)
        return (raw - np.asarray(self.stats.workload_mean, np.float32)) / \
            np.asarray(self.stats.workload_std, np.float32)

    def target(self, label_ms: float) -> float:
        return (math.log(label_ms) - self.stats.target_mean) / self.stats.target_std

    def batches(self, samples: Sequence[Sample], tokens: int, *, multiple: int = 1,
                shuffle: bool = False, rng: np.random.Generator | None = None,
                shrink: bool = False):
        """Yields `(Batch, idx)`, `idx [B, K]` the sample index of each prediction (-1 for
        padding): samples sharing a sequence form a row (at most K), rows are grouped by
        bucket length T, each bucket with its fixed batch size `bucket_batch_size(T, tokens,
        multiple)`; with `shrink` (prediction), a bucket with fewer rows uses the next power
        of two instead, so a single prediction is not padded to a full training batch."""
        K = self.fc.group
        rows: dict[int, list[list[int]]] = {}  # id(seq) -> rows of at most K samples
        for i, s in enumerate(samples):
            seq_rows = rows.setdefault(id(s.seq), [[]])
            if len(seq_rows[-1]) == K:
                seq_rows.append([])
            seq_rows[-1].append(i)
        by_bucket: dict[int, list[list[int]]] = {}
        for seq_rows in rows.values():
            n = samples[seq_rows[0][0]].seq.num_ops
            by_bucket.setdefault(bucket_length(n, self.fc.buckets), []).extend(seq_rows)
        chunks = []
        for length, bucket_rows in sorted(by_bucket.items()):
            if shuffle:
                bucket_rows = [bucket_rows[j] for j in rng.permutation(len(bucket_rows))]
            bs = bucket_batch_size(length, tokens, multiple)
            if shrink:
                bs = min(bs, max(multiple, 1 << (len(bucket_rows) - 1).bit_length()))
            chunks += [(length, bs, bucket_rows[j:j + bs])
                       for j in range(0, len(bucket_rows), bs)]
        if shuffle:
            chunks = [chunks[j] for j in rng.permutation(len(chunks))]
        for length, bs, chunk in chunks:
            feats = [self.seq(samples[r[0]].seq) for r in chunk]
            wl = [np.stack([self.workload(samples[i].workload, samples[i].seq) for i in r])
                  for r in chunk]
            tgt = [np.array([self.target(samples[i].label_ms) for i in r], np.float32)
                   for r in chunk]
            idx = np.full((bs, K), -1)
            for j, r in enumerate(chunk):
                idx[j, :len(r)] = r
            yield make_batch(feats, wl, tgt, bs, length, K, self.fc.distances), idx


CONFIG_DIM, LOAD_DIM = len(CONFIG_FIELDS) + len(CONV_KINDS), len(LOAD_FIELDS)
