"""The methods an evaluation compares, each fitted on a fold's training samples and predicting its
test samples: the networks (MDOT, GNN, LSTM, per-operator MLP), LightGBM, an MLP on model-level
aggregates, fitted formulas (analytic, roofline) and the operator sums."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mdot_jax import recipes
from mdot_jax.data.aggregates import aggregates
from mdot_jax.data.dataset import Sample
from mdot_jax.data.features import MIN_STD
from mdot_jax.data.splits import split_validation
from mdot_jax.kernels.cost_model import OpSumLine
from mdot_jax.models import ModelConfig
from mdot_jax.models.trained import MAX_Z
from mdot_jax.models.trees import TreeModel
from mdot_jax.training.train import TrainConfig
from mdot_jax.training.train import train as train_model
from mdot_jax.training.workflow import score


# ---------------------------------------------------------------------------- aggregates
def _totals(samples: Sequence[Sample]) -> np.ndarray:
    """`[N, 3]`: forward + backward FLOPs, bytes read + written, operator count."""
    return np.asarray([[s.seq.total("fwd_flops") + s.seq.total("bwd_flops"),
                        s.seq.total("bytes"), s.seq.num_ops] for s in samples])


# ---------------------------------------------------------------------------- methods
@dataclass
class Method:
    name: str
    seed: int = 0
    budget: TrainConfig = field(default_factory=TrainConfig)
    # where a long fit keeps its per-epoch state (keyword-only: set by the harness)
    resume_dir: Path | None = field(default=None, kw_only=True)

    def fit(self, train: Sequence[Sample]) -> None:
        raise NotImplementedError

    def predict(self, samples: Sequence[Sample]) -> np.ndarray:
        raise NotImplementedError


@dataclass
class NeuralMethod(Method):
    model_cfg: ModelConfig = field(default_factory=ModelConfig)

    def fit(self, train):
        self.trained = train_model(train, self.model_cfg, self.budget.replace(seed=self.seed),
                                   progress=False, resume_dir=self.resume_dir)

    def predict(self, samples):
        return score(self.trained, samples)[0]


@dataclass
class LightGBMMethod(Method):
    """Gradient-boosted trees on aggregates (`companion.TreeModel`, grid on validation)."""

    def fit(self, train):
        self.model = TreeModel.fit(train, seed=self.seed, val_fraction=self.budget.val_fraction,
                                   val_by=self.budget.val_by)

    def predict(self, samples):
        return self.model.predict(samples)


@dataclass
class AggregateMLPMethod(Method):
    """An MLP on standardised aggregates (Adam, early stopping on the validation part)."""

    hidden: int = 128
    steps: int = 3000

    def fit(self, train):
        import jax
        import jax.numpy as jnp
        import optax

        tr, val = split_validation(train, self.budget.val_fraction, self.seed,
                                   self.budget.val_by)
        self.devices = sorted({s.workload.device for s in train})
        x = np.stack([aggregates(s, self.devices) for s in tr])
        self.mean, self.std = x.mean(0), np.where(x.std(0) > MIN_STD, x.std(0), 1.0)
        self.ymean = float(np.log([s.label_ms for s in tr]).mean())
        self.ystd = float(np.log([s.label_ms for s in tr]).std() or 1.0)
        xs, ys = self._x(tr), np.log([s.label_ms for s in tr]) - self.ymean
        xv, yv = self._x(val), np.log([s.label_ms for s in val]) - self.ymean
        k1, k2 = jax.random.split(jax.random.key(self.seed))
        d = xs.shape[1]
        params = dict(w1=jax.random.normal(k1, (d, self.hidden)) / np.sqrt(d),
                      b1=jnp.zeros(self.hidden),
                      w2=jax.random.normal(k2, (self.hidden, 1)) / np.sqrt(self.hidden),
                      b2=jnp.zeros(1))
        tx = optax.adamw(1e-3, weight_decay=1e-4)
        opt = tx.init(params)

        def f(p, x):
            return (jax.nn.gelu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"])[:, 0]

        @jax.jit
        def step(p, o):
            loss, g = jax.value_and_grad(lambda p: jnp.mean((f(p, xs) - ys) ** 2))(p)
            u, o = tx.update(g, o, p)
            return optax.apply_updates(p, u), o, loss

        best = (np.inf, params)
        for i in range(self.steps):
            params, opt, _ = step(params, opt)
            if i % 50 == 0:
                err = float(np.mean(np.abs(np.expm1(np.asarray(f(params, xv)) - yv))))
                if err < best[0]:
                    best = (err, params)
        self.params, self.f = best[1], f

    def _x(self, samples):
        return (np.stack([aggregates(s, self.devices) for s in samples]) - self.mean) / self.std

    def predict(self, samples):
        y = np.asarray(self.f(self.params, self._x(samples)), np.float64)
        # as for the neural methods (trained.predict_samples): never inf from extrapolation
        return np.exp(np.clip(y, -MAX_Z * self.ystd, MAX_Z * self.ystd) + self.ymean)


@dataclass
class FittedFormulaMethod(Method):
    """`analytic` or `roofline`: a formula in a few constants fitted with
    differential evolution on mean squared log error + a small L2 penalty on the constants."""

    kind: str = "analytic"
    l2: float = 1e-4

    def _predict(self, c, t):
        flops, nbytes, ops = t[:, 0], t[:, 1], t[:, 2]
        if self.kind == "roofline":  # c = log(1/peak), log(1/bandwidth)
            return np.exp(c[0]) * flops + np.exp(c[1]) * nbytes
        return np.exp(c[0]) + np.exp(c[1]) * flops + np.exp(c[2]) * nbytes + np.exp(c[3]) * ops

    def fit(self, train):
        from scipy.optimize import differential_evolution

        t, y = _totals(train), np.log([s.label_ms for s in train])
        n = 2 if self.kind == "roofline" else 4
        center = -20.0 if self.kind == "roofline" else -10.0

        def cost(c):
            pred = np.log(np.maximum(self._predict(c, t), 1e-12))
            return np.mean((pred - y) ** 2) + self.l2 * np.sum((c - center) ** 2) / n

        res = differential_evolution(cost, [(-50.0, 10.0)] * n, seed=self.seed, tol=1e-8,
                                     maxiter=300, polish=True)
        self.c = res.x

    def predict(self, samples):
        return self._predict(self.c, _totals(samples))


@dataclass
class OpSumMethod(Method):
    """`op-sum`: the summed predicted operator times of the graph (the kernel cost model,
    `--op-costs`) in the line `models.kernels.OpSumLine` fitted on the training samples: what an
    op-grounded checkpoint carries as its third member. `op-sum-params`: the line with a
    parameter term (docs/studies/op-sum-params.md)."""

    def fit(self, train):
        self.line = OpSumLine.fit(train, params=self.name == "op-sum-params")

    def predict(self, samples):
        return self.line.predict(samples)


def make_method(name: str, seed: int, budget: TrainConfig) -> Method:
    neural = recipes.method_models()
    base = neural["mdot"]
    if name in neural:
        return NeuralMethod(name, seed, budget, model_cfg=neural[name])
    other = {"lightgbm": lambda: LightGBMMethod(name, seed, budget),
             "mlp": lambda: AggregateMLPMethod(name, seed, budget),
             "analytic": lambda: FittedFormulaMethod(name, seed, budget, kind="analytic"),
             "roofline": lambda: FittedFormulaMethod(name, seed, budget, kind="roofline"),
             "op-sum": lambda: OpSumMethod(name, seed, budget),
             "op-sum-params": lambda: OpSumMethod(name, seed, budget),
             "mdot-relative": lambda: NeuralMethod(name, seed, budget.replace(loss="relative"),
                                                   model_cfg=base),
             "mdot-pe-none-l1": lambda: NeuralMethod(name, seed, budget.replace(loss="l1"),
                                                     model_cfg=ModelConfig())}
    if name not in other:
        raise ValueError(f"unknown method {name!r}: choose from {sorted([*neural, *other])}")
    return other[name]()


VIEW = "@"  # `<method>@<view>`: a method's predictions from another view of the samples


DEFAULT_METHOD = "mdot-pe-none"  # the MDOT row of the main table besides the paper's (`mdot`)


ALL_METHODS = ("mdot", "lightgbm", "mlp", "per_op", "gnn", "lstm", "analytic", "roofline",
               "mdot-pe-none", "mdot-pe-sinusoidal", "mdot-pe-depth", "mdot-pe-laplacian",
               "mdot-pe-random_walk", "mdot-pe-distance_bias", "mdot-concat", "mdot-per_op",
               "mdot-relative", "mdot-pe-none-l1")


# need operator times (`--op-costs`): not in "all"
OP_METHODS = ("op-sum", "op-sum-params")
