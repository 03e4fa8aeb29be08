"""A GPU kernel model with physical structure, in Flax: the time of one kernel on any NVIDIA
GPU, at any precision, from its shapes and the GPU's spec sheet, never faster than the
roofline.

    t = launch + smooth_max(FLOPs / (peak x u_c), bytes / (bandwidth x u_m))

`u_c` and `u_m` in (0, 1) are the achieved fractions of the precision's peak and of the memory
bandwidth, and `launch` in (0, LAUNCH_MAX_MS) a kernel's fixed cost: sigmoids of one small
network over per-SM, log-scaled features (`FEATURES`): the roofline's two times, waves of
tiles (GEMMs, implicit-GEMM convolutions) or thread blocks over the GPU's SMs and the last
wave's use, the tiles' use, K, the working set over L2, and the GPU as the kernel sees it (its
SMs, clock, FLOPs and bytes per SM per clock: CUDA cores or a tensor-core generation at a
precision are one number). The smooth max is the P-norm of the two times (>= the max, <= 2^(1/P)
of it). Trained on log time (mean absolute error) with Optax, saved with Orbax.

A kernel is described as `gpu_ops` describes operators (`gpu_ops.work`), the GPU as the
kernel sees it (`catalog.as_seen`: the precision's peak; the bandwidth and L2 in elements of
its width), so the two models price the same rows.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from mdot_jax.gpu.catalog import GPU
from mdot_jax.gpu.gpu_ops import RESIDENT, work
from mdot_jax.gpu.neusight import CONV, GEMMS, OPS

VERSION = 1
LAUNCH_MAX_MS = 0.05  # a kernel's fixed cost is below 50 us
U_MIN = 1e-3  # no kernel reaches less of its peak and of the bandwidth
P = 4.0  # the smooth max's norm
FEATURES = ("log_compute_ms", "log_memory_ms", "log_intensity_over_ridge", "log_waves",
            "wave_use", "tile_use", "log_k", "tensor_cores")
# a peak above this many times the CUDA cores' fp32 FLOPs per SM and clock is a tensor core's
TENSOR_OVER_CUDA = 1.5
META = "kernel_model.json"
PARAMS = "kernel_params"


def features(ops: Sequence[str], dims: Sequence[Sequence[int]], gpus: Sequence[GPU]
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(`[N, len(OPS) + len(FEATURES)]` float32 features: the op one-hot then `FEATURES`;
    `[N]` compute ms at the peak; `[N]` memory ms at the bandwidth)."""
    n = len(ops)
    x = np.zeros((n, len(OPS) + len(FEATURES)), np.float32)
    compute, memory = np.zeros(n), np.zeros(n)
    for i, (op, d, g) in enumerate(zip(ops, dims, gpus)):
        flops, moved, units, used, k = work(op, d)
        peak, bw, clock = g.tflops["fp32"] * 1e12, g.memory_gbs * 1e9, g.boost_mhz * 1e6
        compute[i], memory[i] = 1e3 * flops / peak, 1e3 * moved / bw
        waves = units / (g.sms * (1 if op in GEMMS or op == CONV else RESIDENT))
        x[i, OPS.index(op)] = 1.0
        cuda = 2 * (g.cores_per_sm or 128) * g.sms * clock
        x[i, len(OPS):] = (
            math.log10(compute[i]), math.log10(memory[i]), math.log10(compute[i] / memory[i]),
            math.log10(waves), waves / math.ceil(waves), used, math.log10(k),
            float(peak > TENSOR_OVER_CUDA * cuda))
    return x, compute, memory


class KernelNet(nnx.Module):
    """Features -> (log u_c, log u_m, log launch ms), each bounded by a sigmoid."""

    def __init__(self, d_in: int, width: int = 64, *, rngs: nnx.Rngs):
        self.fc1 = nnx.Linear(d_in, width, rngs=rngs)
        self.fc2 = nnx.Linear(width, width, rngs=rngs)
        self.out = nnx.Linear(width, 2, rngs=rngs)
        self.launch = nnx.Linear(len(OPS), 1, rngs=rngs)  # a fixed cost per operator kind

    def __call__(self, x):  # [N, F] -> 3 x [N]
        o = self.out(jax.nn.gelu(self.fc2(jax.nn.gelu(self.fc1(x)))))  # [N, 2]
        launch = self.launch(x[:, : len(OPS)])[:, 0]  # [N]
        u = U_MIN + (1 - U_MIN) * jax.nn.sigmoid(o + 1.0)  # [N, 2] in (U_MIN, 1)
        return (jnp.log(u[:, 0]), jnp.log(u[:, 1]),
                math.log(LAUNCH_MAX_MS) + jax.nn.log_sigmoid(launch - 2.0))


def log_time(net: KernelNet, x, log_compute, log_memory):
    """`[N]` log ms: launch + the P-norm of the compute and memory times at their achieved
    fractions."""
    log_uc, log_um, log_launch = net(x)
    kernel = jax.nn.logsumexp(jnp.stack([P * (log_compute - log_uc),
                                         P * (log_memory - log_um)]), axis=0) / P
    return jnp.logaddexp(log_launch, kernel)


@dataclass
class KernelModel:
    """The trained network, its feature normalisation and what it was fitted on."""

    params: dict  # nnx pure dict of the network's parameters
    mean: np.ndarray  # [F]
    scale: np.ndarray  # [F] 1 / std; 0 for what was constant in the fit (it plays no part)
    gpus: tuple[str, ...]
    samples: int
    info: dict = field(default_factory=dict)  # seed, steps, validation loss, sources
    width: int = 64
    version: int = VERSION
    _net: KernelNet | None = field(default=None, repr=False, compare=False)

    @classmethod
    def fit(cls, ops: Sequence[str], dims: Sequence[Sequence[int]], gpus: Sequence[GPU],
            ms: Sequence[float], *, weights: Sequence[float] | None = None, seed: int = 0,
            steps: int = 3000, batch: int = 4096, width: int = 64, val_fraction: float = 0.1,
            progress: Callable[[str], None] = lambda s: None) -> KernelModel:
        """Fitted with AdamW (cosine decay) on log time, batches drawn with probability
        proportional to `weights` (default: uniform); the parameters kept are those of the
        best loss on a seeded random carve-out, checked every 100 steps."""
        x, compute, memory = features(ops, dims, gpus)
        y = np.log(np.asarray(ms, np.float64)).astype(np.float32)
        mean, std = x.mean(0), x.std(0)
        scale = np.where(std > 1e-6, 1 / np.maximum(std, 1e-6), 0.0).astype(np.float32)
        mean[: len(OPS)], scale[: len(OPS)] = 0.0, 1.0  # the one-hot stays as it is
        data = ((x - mean) * scale, np.log(compute).astype(np.float32),
                np.log(memory).astype(np.float32), y)
        rng = np.random.default_rng(seed)
        val = rng.random(len(y)) < val_fraction
        tr = [a[~val] for a in data]
        w = np.ones(len(y)) if weights is None else np.asarray(weights, np.float64)
        draw = w[~val] / w[~val].sum()
        va = [jnp.asarray(a[val]) for a in data]
        net = KernelNet(x.shape[1], width, rngs=nnx.Rngs(seed))
        graphdef, params = nnx.split(net, nnx.Param)
        tx = optax.adamw(optax.cosine_decay_schedule(3e-3, steps), weight_decay=1e-4)
        opt = tx.init(params)

        def loss(p, xb, lc, lm, yb):
            return jnp.abs(log_time(nnx.merge(graphdef, p), xb, lc, lm) - yb).mean()

        @jax.jit
        def step(p, o, xb, lc, lm, yb):  # one AdamW step on a batch
            value, grads = jax.value_and_grad(loss)(p, xb, lc, lm, yb)
            updates, o = tx.update(grads, o, p)
            return optax.apply_updates(p, updates), o, value

        val_loss = jax.jit(loss)
        best, kept = float("inf"), params
        for s in range(steps):
            idx = rng.choice(len(draw), min(batch, len(draw)), p=draw)
            params, opt, _ = step(params, opt, *(a[idx] for a in tr))
            if (s + 1) % 100 == 0 or s + 1 == steps:
                v = float(val_loss(params, *va)) if val.any() else 0.0
                if v < best:
                    best, kept = v, params
                progress(f"step {s + 1}/{steps}: validation mean |log error| {v:.4f}")
        return cls(jax.tree.map(np.asarray, nnx.to_pure_dict(kept)), mean, scale,
                   tuple(sorted({g.name for g in gpus})), len(y),
                   dict(seed=seed, steps=steps, batch=batch, val_mean_abs_log=best),
                   width)

    def _network(self) -> KernelNet:
        if self._net is None:
            net = KernelNet(len(self.mean), self.width, rngs=nnx.Rngs(0))
            _, state = nnx.split(net, nnx.Param)
            nnx.replace_by_pure_dict(state, self.params)
            nnx.update(net, state)
            self._net = net
        return self._net

    def parts(self, ops: Sequence[str], dims: Sequence[Sequence[int]], gpus: Sequence[GPU]
              ) -> dict[str, np.ndarray]:
        """`ms`, the achieved fractions `u_compute`, `u_memory` and `launch_ms`: `[N]` each."""
        x, compute, memory = features(ops, dims, gpus)
        if not len(x):
            return dict(ms=np.zeros(0), u_compute=np.zeros(0), u_memory=np.zeros(0),
                        launch_ms=np.zeros(0))
        rows, back = np.unique(np.concatenate(
            [x, np.log(compute)[:, None], np.log(memory)[:, None]], 1), axis=0,
            return_inverse=True)  # a model repeats its layers
        back = back.reshape(-1)
        z = jnp.asarray((rows[:, :-2] - self.mean) * self.scale, jnp.float32)
        lc, lm = jnp.asarray(rows[:, -2]), jnp.asarray(rows[:, -1])
        net = self._network()
        log_uc, log_um, log_launch = net(z)
        ms = np.exp(np.asarray(log_time(net, z, lc, lm), np.float64))
        return dict(ms=ms[back], u_compute=np.exp(np.asarray(log_uc))[back],
                    u_memory=np.exp(np.asarray(log_um))[back],
                    launch_ms=np.exp(np.asarray(log_launch))[back])

    def predict(self, ops: Sequence[str], dims: Sequence[Sequence[int]],
                gpus: Sequence[GPU]) -> np.ndarray:
        """`[N]` predicted ms."""
        return self.parts(ops, dims, gpus)["ms"]

    def save(self, folder: str | Path) -> None:
        """Into `folder` (which the caller writes atomically): the parameters with Orbax
        (`PARAMS/`) and the rest as JSON (`META`)."""
        import orbax.checkpoint as ocp

        folder = Path(folder)
        ckptr = ocp.StandardCheckpointer()
        ckptr.save((folder / PARAMS).absolute(), self.params)
        ckptr.wait_until_finished()
        (folder / META).write_text(json.dumps(dict(
            version=self.version, width=self.width, mean=self.mean.tolist(),
            scale=self.scale.tolist(), gpus=list(self.gpus), samples=self.samples,
            features=list(OPS) + list(FEATURES), info=self.info), indent=1) + "\n")

    @classmethod
    def load(cls, folder: str | Path) -> KernelModel:
        import orbax.checkpoint as ocp

        folder = Path(folder)
        d = json.loads((folder / META).read_text())
        if d.get("version") != VERSION:
            raise ValueError(f"{folder}: kernel model version {d.get('version')} != {VERSION}")
        params = ocp.StandardCheckpointer().restore((folder / PARAMS).absolute())
        return cls(jax.tree.map(np.asarray, params), np.asarray(d["mean"], np.float32),
                   np.asarray(d["scale"], np.float32), tuple(d["gpus"]), d["samples"],
                   d["info"], d["width"], d["version"])
