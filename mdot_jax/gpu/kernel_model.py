"""A GPU kernel model with physical structure, in Flax: the time of one kernel on any NVIDIA
GPU, at any precision, from its shapes and the GPU's spec sheet, never faster than the
roofline.

    t = launch + smooth_max(FLOPs / (peak x u_c), bytes / (bandwidth x u_m))

`u_c` and `u_m` in (0, 1) are the achieved fractions of the precision's peak and of the memory
bandwidth, and `launch` in (0, LAUNCH_MAX_MS) a kernel's fixed cost per operator kind:
sigmoids of one small network over log-scaled features relative to the GPU (`FEATURES`): the
roofline's two times and their ratio, waves of tiles (GEMMs, implicit-GEMM convolutions) or
thread blocks over the GPU's SMs and the last wave's use, the tiles' use, K. Each feature is
held to the range it was fitted on, so a GPU unlike the fitted ones is priced as the nearest
fitted kernels were (the network does not extrapolate). On tensor cores (a peak above
`TENSOR_OVER_CUDA` times the CUDA cores'), `u_c` is the fraction the same features give times
a second bounded factor, learned from measured tensor-core kernels only, and the kernel is
never priced slower than on the CUDA cores. The smooth max is the P-norm of the two times (>=
the max, <= 2^(1/P) of it). Trained on log time (mean absolute error) with Optax, saved with
Orbax.

A kernel is described as `gpu_ops` describes operators (`gpu_ops.work`), the GPU as the
kernel sees it (`catalog.as_seen`: the precision's peak; the bandwidth and L2 in elements of
its width), so the two models price the same rows.
"""

from __future__ import annotations

import dataclasses
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
from mdot_jax.gpu.neusight import OPS
from mdot_jax.gpu.work import waves, work

VERSION = 2
LAUNCH_MAX_MS = 0.05  # a kernel's fixed cost is below 50 us
U_MIN = 1e-3  # no kernel reaches less of its peak and of the bandwidth
P = 4.0  # the smooth max's norm
FEATURES = ("log_compute_ms", "log_memory_ms", "log_intensity_over_ridge", "log_waves",
            "wave_use", "tile_use", "log_k")
# a peak above this many times the CUDA cores' fp32 FLOPs per SM and clock is a tensor core's
TENSOR_OVER_CUDA = 1.5
META = "kernel_model.json"
PARAMS = "kernel_params"


def cuda_peak(gpu: GPU) -> float:
    """TFLOP/s of the GPU's CUDA cores at fp32 (an FMA per core per clock)."""
    return 2 * (gpu.cores_per_sm or 128) * gpu.sms * gpu.boost_mhz * 1e6 / 1e12


def on_tensor_cores(gpu: GPU) -> bool:
    """Whether a kernel on `gpu` as it sees it (`catalog.as_seen`) runs on tensor cores."""
    return gpu.tflops["fp32"] > TENSOR_OVER_CUDA * cuda_peak(gpu)


def features(ops: Sequence[str], dims: Sequence[Sequence[int]], gpus: Sequence[GPU]
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(`[N, len(OPS) + len(FEATURES)]` float32 features: the op one-hot then `FEATURES`;
    `[N]` compute ms at the peak; `[N]` memory ms at the bandwidth; `[N]` 1.0 on tensor
    cores, else 0.0)."""
    n = len(ops)
    x = np.zeros((n, len(OPS) + len(FEATURES)), np.float32)
    compute, memory, tensor = np.zeros(n), np.zeros(n), np.zeros(n, np.float32)
    for i, (op, d, g) in enumerate(zip(ops, dims, gpus)):
        flops, moved, units, used, k = work(op, d)
        peak, bw = g.tflops["fp32"] * 1e12, g.memory_gbs * 1e9
        compute[i], memory[i] = 1e3 * flops / peak, 1e3 * moved / bw
        w = waves(op, units, g)
        x[i, OPS.index(op)] = 1.0
        x[i, len(OPS):] = (
            math.log10(compute[i]), math.log10(memory[i]), math.log10(compute[i] / memory[i]),
            math.log10(w), w / math.ceil(w), used, math.log10(k))
        tensor[i] = on_tensor_cores(g)
    return x, compute, memory, tensor


class KernelNet(nnx.Module):
    """(features, tensor-core mask) -> (log u_c, log u_m, log launch ms), each bounded by a
    sigmoid; on tensor cores u_c times a factor of its own head."""

    def __init__(self, d_in: int, width: int = 64, *, rngs: nnx.Rngs):
        self.fc1 = nnx.Linear(d_in, width, rngs=rngs)
        self.fc2 = nnx.Linear(width, width, rngs=rngs)
        self.out = nnx.Linear(width, 3, rngs=rngs)  # u_c, u_m, the tensor cores' factor
        self.launch = nnx.Linear(len(OPS), 1, rngs=rngs)  # a fixed cost per operator kind

    def __call__(self, x, tensor):  # [N, F], [N] -> 3 x [N]
        o = self.out(jax.nn.gelu(self.fc2(jax.nn.gelu(self.fc1(x)))))  # [N, 3]
        launch = self.launch(x[:, : len(OPS)])[:, 0]  # [N]
        u = U_MIN + (1 - U_MIN) * jax.nn.sigmoid(o + 1.0)  # [N, 3] in (U_MIN, 1)
        log_uc = jnp.log(u[:, 0]) + tensor * jnp.log(u[:, 2])
        return (jnp.maximum(log_uc, math.log(U_MIN)), jnp.log(u[:, 1]),
                math.log(LAUNCH_MAX_MS) + jax.nn.log_sigmoid(launch - 2.0))


def log_time(net: KernelNet, x, tensor, log_compute, log_memory):
    """`[N]` log ms: launch + the P-norm of the compute and memory times at their achieved
    fractions."""
    log_uc, log_um, log_launch = net(x, tensor)
    kernel = jax.nn.logsumexp(jnp.stack([P * (log_compute - log_uc),
                                         P * (log_memory - log_um)]), axis=0) / P
    return jnp.logaddexp(log_launch, kernel)


@dataclass
class KernelModel:
    """The trained network, its features' fitted range and normalisation, what it saw."""

    params: dict  # nnx pure dict of the network's parameters
    lo: np.ndarray  # [F] the features' fitted range: beyond it a feature is held at its edge
    hi: np.ndarray  # [F]
    mean: np.ndarray  # [F]
    scale: np.ndarray  # [F] 1 / std; 0 for what was constant in the fit (it plays no part)
    gpus: tuple[str, ...]
    samples: int
    info: dict = field(default_factory=dict)  # seed, steps, validation loss
    width: int = 64
    version: int = VERSION
    _net: KernelNet | None = field(default=None, repr=False, compare=False)

    def _inputs(self, x: np.ndarray) -> np.ndarray:
        return ((np.clip(x, self.lo, self.hi) - self.mean) * self.scale).astype(np.float32)

    @classmethod
    def fit(cls, ops: Sequence[str], dims: Sequence[Sequence[int]], gpus: Sequence[GPU],
            ms: Sequence[float], *, weights: Sequence[float] | None = None, seed: int = 0,
            steps: int = 3000, batch: int = 4096, width: int = 64, val_fraction: float = 0.1,
            progress: Callable[[str], None] = lambda s: None) -> KernelModel:
        """Fitted with AdamW (cosine decay) on log time, batches drawn with probability
        proportional to `weights` (default: uniform); the parameters kept are those of the
        best loss on a seeded random carve-out, checked every 100 steps."""
        x, compute, memory, tensor = features(ops, dims, gpus)
        y = np.log(np.asarray(ms, np.float64)).astype(np.float32)
        mean, std = x.mean(0), x.std(0)
        scale = np.where(std > 1e-6, 1 / np.maximum(std, 1e-6), 0.0).astype(np.float32)
        mean[: len(OPS)], scale[: len(OPS)] = 0.0, 1.0  # the one-hot stays as it is
        model = cls({}, x.min(0), x.max(0), mean, scale, tuple(sorted({g.name for g in gpus})),
                    len(y), width=width)
        data = (model._inputs(x), tensor, np.log(compute).astype(np.float32),
                np.log(memory).astype(np.float32), y)
        rng = np.random.default_rng(seed)
        val = rng.random(len(y)) < val_fraction
        tr = [a[~val] for a in data]
        w = np.ones(len(y)) if weights is None else np.asarray(weights, np.float64)
        draw = w[~val] / w[~val].sum()
        va = [jnp.asarray(a[val]) for a in data]
        graphdef, params = nnx.split(KernelNet(x.shape[1], width, rngs=nnx.Rngs(seed)),
                                     nnx.Param)
        tx = optax.adamw(optax.cosine_decay_schedule(3e-3, steps), weight_decay=1e-4)
        opt = tx.init(params)

        def loss(p, *batch):  # mean |log error|
            *inputs, yb = batch
            return jnp.abs(log_time(nnx.merge(graphdef, p), *inputs) - yb).mean()

        @jax.jit
        def step(p, o, *batch):  # one AdamW step
            value, grads = jax.value_and_grad(loss)(p, *batch)
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
        model.params = jax.tree.map(np.asarray, nnx.to_pure_dict(kept))
        model.info = dict(seed=seed, steps=steps, batch=batch, val_mean_abs_log=best,
                          tensor_core_rows=int(tensor.sum()))
        return model

    def _network(self) -> KernelNet:
        if self._net is None:
            net = KernelNet(len(self.mean), self.width, rngs=nnx.Rngs(0))
            _, state = nnx.split(net, nnx.Param)
            nnx.replace_by_pure_dict(state, self.params)
            nnx.update(net, state)
            self._net = net
        return self._net

    def _parts(self, ops, dims, gpus) -> dict[str, np.ndarray]:
        x, compute, memory, tensor = features(ops, dims, gpus)
        rows, back = np.unique(np.concatenate(
            [x, tensor[:, None], np.log(compute)[:, None], np.log(memory)[:, None]], 1),
            axis=0, return_inverse=True)  # a model repeats its layers
        back = back.reshape(-1)
        z, t = jnp.asarray(self._inputs(rows[:, :-3])), jnp.asarray(rows[:, -3], jnp.float32)
        lc, lm = jnp.asarray(rows[:, -2]), jnp.asarray(rows[:, -1])
        net = self._network()
        log_uc, log_um, log_launch = net(z, t)
        ms = np.exp(np.asarray(log_time(net, z, t, lc, lm), np.float64))
        return dict(ms=ms[back], u_compute=np.exp(np.asarray(log_uc))[back],
                    u_memory=np.exp(np.asarray(log_um))[back],
                    launch_ms=np.exp(np.asarray(log_launch))[back], tensor=tensor)

    def parts(self, ops: Sequence[str], dims: Sequence[Sequence[int]], gpus: Sequence[GPU]
              ) -> dict[str, np.ndarray]:
        """`ms`, the achieved fractions `u_compute`, `u_memory`, `launch_ms` and whether on
        `tensor` cores: `[N]` each. A tensor-core kernel is never priced above the same kernel
        on the CUDA cores."""
        if not len(ops):
            return {k: np.zeros(0) for k in ("ms", "u_compute", "u_memory", "launch_ms",
                                             "tensor")}
        out = self._parts(ops, dims, gpus)
        tc = np.flatnonzero(out["tensor"])
        if len(tc):
            cuda = [dataclasses.replace(gpus[i], tflops=dict(gpus[i].tflops,
                                                              fp32=cuda_peak(gpus[i])))
                    for i in tc]
            slower = self._parts([ops[i] for i in tc], [dims[i] for i in tc], cuda)["ms"]
            out["ms"][tc] = np.minimum(out["ms"][tc], slower)
        return out

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
            version=self.version, width=self.width, lo=self.lo.tolist(), hi=self.hi.tolist(),
            mean=self.mean.tolist(), scale=self.scale.tolist(), gpus=list(self.gpus),
            samples=self.samples, features=list(OPS) + list(FEATURES), info=self.info),
            indent=1) + "\n")

    @classmethod
    def load(cls, folder: str | Path) -> KernelModel:
        import orbax.checkpoint as ocp

        folder = Path(folder)
        d = json.loads((folder / META).read_text())
        if d.get("version") != VERSION:
            raise ValueError(f"{folder}: kernel model version {d.get('version')} != {VERSION}")
        params = ocp.StandardCheckpointer().restore((folder / PARAMS).absolute())
        return cls(jax.tree.map(np.asarray, params),
                   *(np.asarray(d[k], np.float32) for k in ("lo", "hi", "mean", "scale")),
                   tuple(d["gpus"]), d["samples"], d["info"], d["width"], d["version"])
