"""Training MDOT with Optax: pure jitted steps, bucketed batches, data parallel over devices.

Data parallelism: a 1-D mesh over all devices (`jax.devices()`), the batch sharded along it,
parameters and optimizer state replicated; XLA inserts the gradient all-reduce. The same code
runs on 1 CPU, N GPUs or a TPU slice.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from mdot_jax.data.dataset import Sample
from mdot_jax.data.features import (
    Batch,
    FeatureCache,
    FeatureConfig,
    fit_stats,
    sequences_fused,
    sequences_op_costs,
)
from mdot_jax.data.splits import VAL_BY, split_validation
from mdot_jax.metrics import regression_metrics
from mdot_jax.models import ModelConfig, build_model
from mdot_jax.models.config import check_numbers
from mdot_jax.models.trained import Trained, predict_samples

# per-sample loss of d = log(pred_ms) - log(true_ms)
LOSSES = {"mse": lambda d: d ** 2, "l1": jnp.abs,  # squared / absolute log error
          "relative": lambda d: jnp.abs(jnp.expm1(d))}  # |pred / true - 1|


@dataclass(frozen=True)
class TrainConfig:
    tokens_per_batch: int = 4096  # operators per batch; batch size = tokens // bucket length
    epochs: int = 30
    lr: float = 1e-3
    weight_decay: float = 1e-4
    warmup_frac: float = 0.05
    clip_norm: float = 1.0
    patience: int = 6  # epochs without validation improvement before stopping
    val_fraction: float = 0.1  # of the training samples, held out for early stopping
    val_by: str = "sample"  # the carve-out: random samples or whole families (VAL_BY)
    loss: str = "mse"  # one of LOSSES
    seed: int = 0

    def __post_init__(self):
        check_numbers(self)
        for name in ("tokens_per_batch", "epochs", "lr", "patience"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} {getattr(self, name)!r}: must be > 0")
        for name in ("weight_decay", "warmup_frac", "clip_norm"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} {getattr(self, name)!r}: must be >= 0")
        if not 0 < self.val_fraction < 1:
            raise ValueError(f"val_fraction {self.val_fraction!r}: must be between 0 and 1")
        if self.loss not in LOSSES:
            raise ValueError(f"loss {self.loss!r}: choose from {', '.join(LOSSES)}")
        if self.val_by not in VAL_BY:
            raise ValueError(f"val_by {self.val_by!r}: choose from {', '.join(VAL_BY)}")

    def replace(self, **kw) -> TrainConfig:
        return dataclasses.replace(self, **kw)


def make_mesh() -> Mesh:
    return Mesh(np.array(jax.devices()), ("data",))


def _loss(pred, batch: Batch, target_std: float, kind: str):
    d = (pred - batch.target) * target_std  # log(pred_ms) - log(true_ms)  [B, K]
    per = LOSSES[kind](d)
    return (per * batch.weight).sum() / jnp.maximum(batch.weight.sum(), 1.0)


def make_steps(graphdef, tx, target_std: float, loss_kind: str, mesh: Mesh):
    """Pure `train_step(params, opt_state, batch, rng)` and `predict_step(params, batch)`,
    jitted with batch-sharded inputs. `train_step.traces` counts compilations."""
    data = NamedSharding(mesh, P("data"))
    repl = NamedSharding(mesh, P())
    traces = {"train": 0, "predict": 0}

    def loss_fn(params, batch, rng):
        pred, _ = nnx.merge(graphdef, params)(batch, train=True, rng=rng)
        return _loss(pred, batch, target_std, loss_kind)

    def train_step(params, opt_state, batch, rng):
        traces["train"] += 1  # runs at trace time only
        loss, grads = jax.value_and_grad(loss_fn)(params, batch, rng)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    def predict_step(params, batch):
        traces["predict"] += 1
        return nnx.merge(graphdef, params)(batch, train=False)[0]

    train_jit = jax.jit(train_step, in_shardings=(repl, repl, data, repl),
                        out_shardings=(repl, repl, repl), donate_argnums=(0, 1))
    predict_jit = jax.jit(predict_step, in_shardings=(repl, data), out_shardings=data)
    return train_jit, predict_jit, traces


class Resume:
    """Crash-safe training: the state at the end of every epoch, in `root` (atomic writes).

      state.npz   the leaves of (params, optimizer state, best params so far)
      state.json  run key, epoch, step, best score, epochs without improvement, elapsed
                  seconds, history and the host RNG state (batch shuffling)
    A run resumes only from a state with the same run key (same samples, configs and
    seeds); the resumed run takes exactly the steps the uninterrupted one would have.
    """

    def __init__(self, root: str | Path, run_key: str):
        self.root, self.run_key = Path(root), run_key

    def load(self, template) -> tuple[object, dict] | None:
        """`(tree shaped like template, counters)`, or None if there is no matching state."""
        try:
            counters = json.loads((self.root / "state.json").read_text())
            if counters.get("run_key") != self.run_key:
                return None
            with np.load(self.root / "state.npz") as z:
                leaves = [z[f"a{i}"] for i in range(len(z.files))]
        except (OSError, ValueError, KeyError):
            return None
        if len(leaves) != len(jax.tree.leaves(template)):
            return None
        return jax.tree.unflatten(jax.tree.structure(template), leaves), counters

    def save(self, tree, counters: dict) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        leaves = {f"a{i}": np.asarray(x) for i, x in enumerate(jax.tree.leaves(tree))}
        np.savez(self.root / "state.tmp.npz", **leaves)
        (self.root / "state.tmp.json").write_text(json.dumps(dict(counters, run_key=self.run_key),
                                                             default=float))
        # never a json beside an npz of another epoch: a crash in between loses the state
        (self.root / "state.json").unlink(missing_ok=True)
        (self.root / "state.tmp.npz").replace(self.root / "state.npz")
        (self.root / "state.tmp.json").replace(self.root / "state.json")


def run_key(samples, val_samples, *configs) -> str:
    """Identifies a training run: its samples (in order) and configs."""
    h = hashlib.sha256()
    for s in [*samples, None, *val_samples]:
        h.update(f"{s.key}:{s.label_ms:.6g}\n".encode() if s else b"|")
    h.update(json.dumps([dataclasses.asdict(c) for c in configs], default=str).encode())
    return h.hexdigest()[:16]


def label_range(samples: Sequence[Sample]) -> list[float]:
    """The fastest and the slowest measured step of `samples` (ms, 4 significant digits):
    a prediction outside them is extrapolation (`Predictor._outside_labels`)."""
    labels = [s.label_ms for s in samples]
    return [float(f"{min(labels):.4g}"), float(f"{max(labels):.4g}")]


def train(samples: Sequence[Sample], model_cfg: ModelConfig, train_cfg: TrainConfig = TrainConfig(),
          feature_cfg: FeatureConfig | None = None, *, val_samples: Sequence[Sample] | None = None,
          progress: bool = True, log: Callable[[str], None] | None = None,
          resume_dir: str | Path | None = None) -> Trained:
    """Fits MDOT on `samples`; early stopping on `val_samples` (default: a random
    `val_fraction` of `samples`). Normalisation statistics come from the training part only.
    With `resume_dir`, the state after every epoch is kept there and a re-run of the same
    training continues from it (see `Resume`).
    """
    from tqdm import tqdm

    fused = sequences_fused(s.seq for s in [*samples, *(val_samples or [])])
    feature_cfg = feature_cfg or FeatureConfig(
        lap_dim=model_cfg.lap_dim, rw_dim=model_cfg.rw_dim,
        distances="distance_bias" in model_cfg.pe, fused=fused,
        op_costs=sequences_op_costs(s.seq for s in [*samples, *(val_samples or [])]))
    if feature_cfg.fused != fused:
        raise ValueError(f"feature config fused={feature_cfg.fused}, but the sequences are "
                         f"{'fused' if fused else 'unfused'}")
    if val_samples is None:
        samples, val_samples = split_validation(samples, train_cfg.val_fraction,
                                                train_cfg.seed, train_cfg.val_by)
    longest = feature_cfg.buckets[-1]
    too_long = sorted({s.arch for s in list(samples) + list(val_samples)
                       if s.seq.num_ops > longest})
    if too_long:  # said, not silent: kept out of training, listed in the checkpoint
        if log:
            log(f"excluded {len(too_long)} architectures longer than {longest} operators: "
                f"{too_long}")
        samples = [s for s in samples if s.seq.num_ops <= longest]
        val_samples = [s for s in val_samples if s.seq.num_ops <= longest]
    if not samples:
        raise ValueError("no training samples")
    stats = fit_stats(samples)
    cache = FeatureCache(stats, feature_cfg)
    n_dev = jax.device_count()
    tokens = train_cfg.tokens_per_batch
    probe = next(cache.batches(samples[:1], tokens, multiple=n_dev))[0]
    model_cfg = model_cfg.replace(workload_dim=probe.workload.shape[-1],
                                  load_dim=probe.load.shape[-1])
    model = build_model(model_cfg, nnx.Rngs(train_cfg.seed))
    graphdef, params = nnx.split(model, nnx.Param)

    shapes = [b.op_type.shape for b, _ in cache.batches(samples, tokens, multiple=n_dev)]
    batch_sizes = {length: size for size, length in shapes}  # [B, T] per bucket
    steps_per_epoch = len(shapes)
    total = max(1, steps_per_epoch * train_cfg.epochs)
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, train_cfg.lr, max(1, int(train_cfg.warmup_frac * total)), total, train_cfg.lr * 0.01)
    tx = optax.chain(optax.clip_by_global_norm(train_cfg.clip_norm),
                     optax.adamw(schedule, weight_decay=train_cfg.weight_decay))
    mesh = make_mesh()
    repl = NamedSharding(mesh, P())
    params = jax.device_put(params, repl)
    opt_state = jax.device_put(tx.init(params), repl)
    train_step, predict_step, traces = make_steps(graphdef, tx, stats.target_std,
                                                  train_cfg.loss, mesh)

    rng = np.random.default_rng(train_cfg.seed)
    key = jax.random.key(train_cfg.seed)
    best, best_params, bad_epochs, history, step = math.inf, None, 0, [], 0
    start, done, spent = 0, False, 0.0
    resume = Resume(resume_dir, run_key(samples, val_samples, model_cfg, train_cfg,
                                        feature_cfg)) if resume_dir else None
    state = resume.load((params, opt_state, params)) if resume else None
    if state:
        (params, opt_state, best_params), c = state
        params, opt_state = jax.device_put((params, opt_state), repl)
        # best params exist once a score improved on inf (saved as params until then)
        best_params = jax.tree.map(np.asarray, best_params) if c["best"] < math.inf else None
        best, bad_epochs, history, step = c["best"], c["bad_epochs"], c["history"], c["step"]
        start, done, spent = c["epoch"] + 1, c["done"], c["seconds"]
        rng.bit_generator.state = c["rng"]
        if log:
            log(f"resumed from {resume_dir} after epoch {c['epoch']} (step {step})")
    val_true = np.array([s.label_ms for s in val_samples])
    t0 = time.perf_counter() - spent
    bar = tqdm(range(start, train_cfg.epochs if not done else start), desc="train",
               unit="epoch", initial=start, total=train_cfg.epochs, disable=not progress)
    for epoch in bar:
        losses = []
        for batch, _ in cache.batches(samples, tokens, multiple=n_dev, shuffle=True, rng=rng):
            params, opt_state, loss = train_step(params, opt_state, batch,
                                                 jax.random.fold_in(key, step))
            losses.append(loss)
            step += 1
        train_loss = float(np.mean([float(x) for x in losses]))
        row = dict(epoch=epoch, step=step, train_loss=train_loss,
                   seconds=round(time.perf_counter() - t0, 1))
        if val_samples:
            pred = predict_samples(predict_step, params, cache, val_samples, tokens)
            row.update({f"val_{k}": v for k, v in regression_metrics(pred, val_true).items()})
            score = row["val_mape"]
        else:
            score = train_loss
        history.append(row)
        bar.set_postfix(loss=f"{train_loss:.4f}", val_mape=f"{row.get('val_mape', 0):.2f}%")
        if log:
            log(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                         for k, v in row.items()))
        if score < best:
            best, bad_epochs = score, 0
            best_params = jax.tree.map(np.asarray, params)
        else:
            bad_epochs += 1
        done = bad_epochs >= train_cfg.patience
        if resume:
            resume.save((params, opt_state, params if best_params is None else best_params),
                        dict(epoch=epoch, step=step, best=best, bad_epochs=bad_epochs,
                             done=done, history=history,
                             seconds=time.perf_counter() - t0, rng=rng.bit_generator.state))
        if done:
            break
    bar.close()
    elapsed = time.perf_counter() - t0
    info = dict(train_samples=len(samples), val_samples=len(val_samples), steps=step,
                batch_sizes=sorted({s.workload.batch_size for s in samples}),
                input_sizes=sorted({s.workload.input_size for s in samples}),
                label_ms=label_range([*samples, *val_samples]),
                layouts=sorted({s.workload.layout for s in samples}),
                input_kinds=sorted({s.seq.input_kind for s in samples}),
                op_types=sorted({t for s in samples for t in s.seq.op_type_counts()}),
                precisions=sorted({s.workload.precision for s in samples}),
                optimizers=sorted({s.workload.optimizer for s in samples}),
                architectures=sorted({s.arch for s in [*samples, *val_samples]}),
                excluded_too_long=too_long,
                seconds=round(elapsed, 1), steps_per_s=round(step / max(elapsed, 1e-9), 2),
                best_val_mape=best if val_samples else None, devices=n_dev,
                compiled_train_shapes=traces["train"], tokens_per_batch=tokens,
                batch_size_by_length={str(k): v for k, v in sorted(batch_sizes.items())},
                train_config=dataclasses.asdict(train_cfg))
    return Trained(graphdef, best_params, model_cfg, feature_cfg, stats, history, info)
