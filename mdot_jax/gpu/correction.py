"""A learned correction of a GPU step's spec-sheet price: step = physics x exp(c), with
c = BOUND tanh(f / BOUND), so that whatever the learner says, the answer stays within
e^BOUND of physics; a GPU or a model unlike the training data falls back towards physics.

f is read from the operator sequence (each token: type, configuration, load and its
spec-sheet ms on the target GPU, `gpu.step_table`) and a workload vector (batch, input size,
graph totals, the price and its phases, the GPU's spec-sheet features, the precision) by
- `mdot`: the MDOT Transformer (`models.MDOT`), pooled over operators, read per workload;
- `gnn`: the graph network baseline (`models.GNN`) on the same tokens;
- `lightgbm`: LightGBM on the workload vector, operator counts by type and the spec-sheet
  time by kind of work (the same information, aggregated), clipped to the same bound;
- `physics`: c = 0.
Networks: Optax AdamW (warm-up, cosine), absolute error of c against log(measured /
physics), the epoch with the least MAPE on a 10% carve-out of the training rows kept.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from mdot_jax.data.aggregates import op_time_breakdown
from mdot_jax.data.features import (
    MIN_STD,
    FeatureCache,
    FeatureConfig,
    FeatureStats,
    bucket_batch_size,
    bucket_length,
    graph_totals,
    make_batch,
    op_config,
    op_load,
    seq_features,
)
from mdot_jax.gpu import catalog as gpus
from mdot_jax.gpu.peaks import matmul_peak
from mdot_jax.gpu.step_table import GpuStep
from mdot_jax.models import PAPER_PE, ModelConfig, build_model
from mdot_jax.options import PRECISIONS

ONE_HOT = PRECISIONS[:5]  # the precisions measured steps can have: the features' width is fixed

BOUND = math.log(2.0)  # the correction never moves the spec-sheet price by more than 2x
PHASES = ("forward", "backward", "update", "launch gaps")
METHODS = ("physics", "mdot", "gnn", "lightgbm")


def _slog(x):
    return np.sign(x) * np.log1p(np.abs(x))


def gpu_features(gpu: gpus.GPU, precision: str) -> list[float]:
    """The GPU as its spec sheet describes it, at `precision`: log matmul peak, fp32 peak,
    memory bandwidth, ridge point, SMs, clock, L2, memory."""
    peak = matmul_peak(gpu, precision)
    return [math.log(v) for v in (peak, gpu.tflops["fp32"], gpu.memory_gbs,
                                  1e3 * peak / gpu.memory_gbs, gpu.sms, gpu.boost_mhz,
                                  gpu.l2_mb, gpu.memory_gb)]


def workload(r: GpuStep) -> np.ndarray:
    """`[W]` raw workload vector of a row (`step_table.GpuStep`)."""
    numeric = [math.log2(r.batch), math.log2(max(r.input_size, 1)),
               *_slog(graph_totals(r.seq)).tolist(), math.log(r.physics_ms),
               *[math.log1p(1e3 * r.phases.get(k, 0.0)) for k in PHASES],
               *gpu_features(gpus.find(r.gpu), r.precision), float(r.transformer)]
    return np.asarray(numeric + [float(r.precision == p) for p in ONE_HOT], np.float32)


def target(r: GpuStep) -> float:
    return math.log(r.measured_ms / r.physics_ms)


def leave_out(rows: Sequence[GpuStep], gpu: str) -> tuple[list[GpuStep], list[GpuStep]]:
    """(the other GPUs' rows, `gpu`'s rows): what a fold fits on and what it scores."""
    train = [r for r in rows if r.gpu != gpu]
    held = [r for r in rows if r.gpu == gpu]
    if not held:
        raise ValueError(f"no rows of {gpu} to hold out")
    return train, held


def bounded(f):
    return BOUND * jnp.tanh(f / BOUND)


def _mean_std(a: np.ndarray) -> tuple[list, list]:
    std = a.std(axis=0)
    return a.mean(axis=0).tolist(), np.where(std > MIN_STD, std, 1.0).tolist()


@dataclass
class NetworkCorrection:
    """A trained network (MDOT or GNN) and its normalisation."""

    graphdef: nnx.GraphDef
    params: nnx.State
    cache: FeatureCache
    history: list = field(default_factory=list)

    def predict(self, rows: Sequence[GpuStep], tokens: int = 4096) -> np.ndarray:
        """Predicted ms of each row."""
        c = np.zeros(len(rows))
        for batch, idx in _batches(self.cache, rows, tokens):
            out = np.asarray(_predict(self.graphdef, self.params, batch))  # [B, 1]
            c[idx[idx >= 0]] = out[idx >= 0]
        return np.array([r.physics_ms for r in rows]) * np.exp(c)


_RAW: dict[int, tuple] = {}  # id(seq) -> (seq, features at unit statistics), once per process


class _Cache(FeatureCache):
    """`FeatureCache` whose graph encodings (the cost) are computed once per sequence and
    shared by every fit; each fit normalises them with its own training statistics."""

    def seq(self, seq):
        key = id(seq)
        if key not in self._seqs:
            if key not in _RAW:  # holding the sequence keeps its id from being reused
                _RAW[key] = seq, seq_features(seq, _UNIT, self.fc)
            f, st = _RAW[key][1], self.stats
            self._seqs[key] = seq, f._replace(
                config=((f.config - st.config_mean) / st.config_std).astype(np.float32),
                load=((f.load - st.load_mean) / st.load_std).astype(np.float32))
        return self._seqs[key][1]


_UNIT = FeatureStats([0.0], [1.0], [0.0], [1.0], [], [], 0.0, 1.0)


def _stats(rows: Sequence[GpuStep]) -> FeatureStats:
    seqs = {id(r.seq): r.seq for r in rows}.values()
    cfg = np.concatenate([_slog(op_config(q)) for q in seqs])
    load = np.concatenate([op_load(q) for q in seqs])
    return FeatureStats(*_mean_std(cfg), *_mean_std(load),
                        *_mean_std(np.stack([workload(r) for r in rows])), 0.0, 1.0)


def _batches(cache: FeatureCache, rows: Sequence[GpuStep], tokens: int, *,
             rng: np.random.Generator | None = None):
    """`(Batch, idx [B, 1])`: rows bucketed by length, shuffled when `rng` is given."""
    by_len: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        by_len.setdefault(bucket_length(r.seq.num_ops, cache.fc.buckets), []).append(i)
    chunks = []
    for length, ids in sorted(by_len.items()):
        if rng is not None:
            ids = [ids[j] for j in rng.permutation(len(ids))]
        bs = bucket_batch_size(length, tokens)
        if rng is None:  # prediction: no padding to a full training batch
            bs = min(bs, 1 << (len(ids) - 1).bit_length())
        chunks += [(length, bs, ids[j:j + bs]) for j in range(0, len(ids), bs)]
    if rng is not None:
        chunks = [chunks[j] for j in rng.permutation(len(chunks))]
    mean, std = (np.asarray(v, np.float32) for v in (cache.stats.workload_mean,
                                                      cache.stats.workload_std))
    for length, bs, ids in chunks:
        feats = [cache.seq(rows[i].seq) for i in ids]
        wl = [((workload(rows[i]) - mean) / std)[None] for i in ids]
        tgt = [np.array([target(rows[i])], np.float32) for i in ids]
        idx = np.full((bs, 1), -1)
        idx[:len(ids), 0] = ids
        yield make_batch(feats, wl, tgt, bs, length, 1, False), idx


@functools.partial(jax.jit, static_argnums=0)
def _predict(graphdef, params, batch):
    return bounded(nnx.merge(graphdef, params)(batch, train=False)[0])  # [B, 1]


def mape(pred: np.ndarray, rows: Sequence[GpuStep]) -> float:
    """Mean absolute percentage error of `pred` (ms) against the rows' measured ms."""
    return float(np.mean([abs(p / r.measured_ms - 1) for p, r in zip(pred, rows)]) * 100)


def fit_network(rows: Sequence[GpuStep], arch: str = "mdot", *, seed: int = 0,
                epochs: int = 10, lr: float = 1e-3, tokens: int = 4096, d_model: int = 32,
                pe: tuple[str, ...] = PAPER_PE, val_fraction: float = 0.1,
                progress: Callable[[dict], None] | None = None) -> NetworkCorrection:
    """Trains the `arch` network's correction on `rows`; the epoch with the least MAPE on a
    `val_fraction` carve-out (drawn with `seed`) is kept. `pe`: MDOT's graph positional
    encodings (the paper's; () for none)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(rows))
    n_val = max(1, int(round(val_fraction * len(rows))))
    val = [rows[i] for i in order[:n_val]]
    train = [rows[i] for i in order[n_val:]]
    fusion = {r.seq.fusion for r in rows}
    if len(fusion) > 1:
        raise ValueError(f"rows mix fusion versions {sorted(fusion)}: convert them one way")
    cache = _Cache(_stats(train), FeatureConfig(group=1, fused=fusion.pop(), op_costs=True))
    probe = next(_batches(cache, train[:1], tokens))[0]
    cfg = ModelConfig(arch=arch, workload_dim=probe.workload.shape[-1],
                      load_dim=probe.load.shape[-1], d_model=d_model, n_heads=4,
                      n_layers=2, pe=pe if arch == "mdot" else ())
    graphdef, params = nnx.split(build_model(cfg, nnx.Rngs(seed)), nnx.Param)
    steps = sum(1 for _ in _batches(cache, train, tokens, rng=np.random.default_rng(0)))
    total = max(2, steps * epochs)  # warm-up and at least one step of decay
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(
        optax.warmup_cosine_decay_schedule(0.0, lr, max(1, total // 20), total, lr * 0.01),
        weight_decay=1e-4))
    opt_state = tx.init(params)

    @jax.jit
    def train_step(params, opt_state, batch, key):
        def loss_fn(p):
            f, _ = nnx.merge(graphdef, p)(batch, train=True, rng=key)
            err = jnp.abs(bounded(f) - batch.target) * batch.weight  # [B, 1]
            return err.sum() / jnp.maximum(batch.weight.sum(), 1.0)
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    key, step, best, history = jax.random.key(seed), 0, (math.inf, params), []
    for epoch in range(epochs):
        t0 = time.perf_counter()
        losses = []
        for batch, _ in _batches(cache, train, tokens, rng=rng):
            params, opt_state, loss = train_step(params, opt_state, batch,
                                                 jax.random.fold_in(key, step))
            losses.append(float(loss))
            step += 1
        val_mape = mape(NetworkCorrection(graphdef, params, cache).predict(val, tokens), val)
        history.append(dict(epoch=epoch, train_loss=float(np.mean(losses)), val_mape=val_mape,
                            seconds=time.perf_counter() - t0))
        if progress:
            progress(history[-1])
        if val_mape < best[0]:
            best = (val_mape, jax.tree.map(np.asarray, params))
    return NetworkCorrection(graphdef, best[1], cache, history)


def tree_features(r: GpuStep) -> np.ndarray:
    """The LightGBM correction's features: the workload vector, log operator counts by
    type, the spec-sheet time by kind of work."""
    from converters.vocab import VOCAB

    counts = np.bincount(np.minimum(r.seq.op_type, len(VOCAB) - 1), minlength=len(VOCAB))
    return np.concatenate([workload(r), np.log1p(counts), op_time_breakdown(r.seq)])


@dataclass
class TreeCorrection:
    boosters: list

    def predict(self, rows: Sequence[GpuStep]) -> np.ndarray:
        x = np.stack([tree_features(r) for r in rows])
        c = np.clip(np.mean([b.predict(x) for b in self.boosters], axis=0), -BOUND, BOUND)
        return np.array([r.physics_ms for r in rows]) * np.exp(c)


def fit_trees(rows: Sequence[GpuStep], *, seed: int = 0, val_fraction: float = 0.1
              ) -> TreeCorrection:
    """LightGBM boosters of the correction (`models.trees.fit_boosters`: its grid, seeds and
    absolute-error objective), validated on the same carve-out as the networks'."""
    from mdot_jax.models.trees import fit_boosters

    order = np.random.default_rng(seed).permutation(len(rows))
    n_val = max(1, int(round(val_fraction * len(rows))))

    def xy(ids):
        return (np.stack([tree_features(rows[i]) for i in ids]),
                np.array([target(rows[i]) for i in ids]))

    return TreeCorrection(fit_boosters(*xy(order[n_val:]), *xy(order[:n_val]), seed=seed))
