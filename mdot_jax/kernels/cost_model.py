"""Kernel cost model: one operator row -> milliseconds per training iteration on one device.

One LightGBM regressor of log time over every measured type (the type is a categorical
feature, so a type seen rarely borrows from the others through the load features), fitted on
an operator dataset (`mdot profile --ops`). The time is forward + backward (+ the SGD update
of the operator's parameters), as measured. `sequence_ms` gives it for every operator of a
sequence: the fourth per-operator dimension and, summed, a graph total.
"""

from __future__ import annotations

import json
import lzma
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from converters.sequence import CONFIG_FIELDS, LOAD_FIELDS, OperatorSequence
from converters.vocab import VOCAB
from mdot_jax import writers
from mdot_jax.data.dataset import OP_MS
from mdot_jax.kernels.specs import LOSS, OpSpec, grad_flow, loss_spec
from mdot_jax.models.trees import PREDICTING, fit_boosters, parse_boosters

FEATURES_VERSION = 1
COST_MODEL = "cost_model.json.xz"  # inside a checkpoint trained on predicted operator times
LOSS_ID = len(VOCAB)  # the loss's type id: after the vocabulary
_LOG = [CONFIG_FIELDS.index(f) for f in ("in_numel", "out_numel", "mm_m", "mm_k", "mm_n",
                                         "in_channels", "out_channels")]
GRID = ((63, 0.05), (255, 0.05))


def type_id(op_type: str) -> int:
    return LOSS_ID if op_type == LOSS else (VOCAB.index(op_type) if op_type in VOCAB else 1)


def features(op_ids: np.ndarray, config: np.ndarray, load: np.ndarray,
             input_grad: np.ndarray) -> np.ndarray:
    """`[N, F]` float32: type id (categorical), raw configuration `[C]`, log10 of the load
    `[L]` and of the sizes, whether backward reaches the inputs."""
    config = np.asarray(config, np.float64)
    load = np.asarray(load, np.float64)
    logs = np.log10(1.0 + np.abs(np.concatenate([load, config[:, _LOG]], axis=1)))
    return np.concatenate([np.asarray(op_ids, np.float64)[:, None], config, logs,
                           np.asarray(input_grad, np.float64)[:, None]], axis=1
                          ).astype(np.float32)


def spec_features(specs: Sequence[OpSpec]) -> np.ndarray:
    return features(np.asarray([type_id(s.op_type) for s in specs]),
                    np.asarray([s.config for s in specs]).reshape(-1, len(CONFIG_FIELDS)),
                    np.asarray([s.load for s in specs]).reshape(-1, len(LOAD_FIELDS)),
                    np.asarray([s.input_grad for s in specs]))


@dataclass
class CostModel:
    """Boosters (LightGBM text) and what they were fitted on."""

    text: str
    device: str
    samples: int
    version: int = FEATURES_VERSION
    _boosters: list = field(default=None, repr=False, compare=False)

    @classmethod
    def fit(cls, records: Sequence[dict], *, seed: int = 0, val_fraction: float = 0.1,
            grid=GRID) -> CostModel:
        """Fitted on operator samples (`read_op_samples` dicts), early-stopped on a seeded
        random carve-out of `val_fraction` of them."""
        specs = [OpSpec.from_json(d["spec"]) for d in records]
        x = spec_features(specs)
        y = np.log([d["label_ms"] for d in records])
        val = np.random.default_rng(seed).random(len(specs)) < val_fraction
        boosters = fit_boosters(x[~val], y[~val], x[val], y[val], seed=seed, grid=grid,
                                seeds=1, categorical=[0], min_data_in_leaf=10)
        devices = sorted({d.get("meta", {}).get("device", "?") for d in records})
        return cls(boosters[0].model_to_string(), ",".join(devices), len(records),
                   _boosters=boosters)

    def _predict(self, x: np.ndarray) -> np.ndarray:
        if self._boosters is None:
            self._boosters = parse_boosters(self.text)
        with PREDICTING:
            return np.exp(self._boosters[0].predict(x))

    def predict(self, specs: Sequence[OpSpec]) -> np.ndarray:
        """`[N]` predicted ms per iteration."""
        return self._predict(spec_features(specs))

    def sequence_ms(self, seq: OperatorSequence) -> np.ndarray:
        """`[N]` predicted ms of every operator of `seq` (types never measured get what their
        load predicts)."""
        return self._predict(features(seq.op_type, seq.config, seq.load, grad_flow(seq)))

    def loss_ms(self, batch: int, classes: int) -> float:
        return float(self.predict([loss_spec(batch, classes)])[0])

    def save(self, path: str | Path) -> None:
        """JSON, xz-compressed when `path` ends in `.xz`; written beside it, then renamed."""
        data = json.dumps(dict(device=self.device, samples=self.samples, version=self.version,
                               text=self.text)).encode()
        tmp = writers.temporary(path)
        tmp.write_bytes(lzma.compress(data) if str(path).endswith(".xz") else data)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        data = Path(path).read_bytes()
        d = json.loads(lzma.decompress(data) if str(path).endswith(".xz") else data)
        if d.get("version") != FEATURES_VERSION:
            raise ValueError(f"{path}: cost model features version {d.get('version')} != "
                             f"{FEATURES_VERSION}")
        return cls(d["text"], d["device"], d["samples"], d["version"])


@dataclass(frozen=True)
class OpSumLine:
    """A model's time from its operators' predicted times (`meta["op_ms"]`): the line
    `a * sum + c`, one scale and one per-iteration overhead (framework, optimizer, loss),
    fitted by relative least squares on measured samples: composition alone. With
    `params=True` the fit adds `e * millions of parameters` (weights, gradients and momentum
    streamed from memory once a model outgrows the caches: docs/studies/op-sum-params.md)."""

    a: float
    c: float
    samples: int = 0  # how many it was fitted on
    e: float = 0.0  # ms per million parameters (0: no parameter term)

    @staticmethod
    def sums(samples) -> np.ndarray:
        """`[N]` each sample's summed predicted operator ms."""
        if any(OP_MS not in s.seq.meta for s in samples):
            raise ValueError("the operator sum needs predicted operator times (--op-costs)")
        return np.asarray([float(np.sum(s.seq.meta[OP_MS])) for s in samples])

    @staticmethod
    def params(samples) -> np.ndarray:
        """`[N]` each sample's parameters, in millions (its operators' `params` load)."""
        column = LOAD_FIELDS.index("params")
        return np.asarray([float(np.asarray(s.seq.load)[:, column].sum()) / 1e6
                           for s in samples])

    @classmethod
    def fit(cls, samples, params: bool = False) -> OpSumLine:
        y = np.asarray([s.label_ms for s in samples])
        cols = [cls.sums(samples), np.ones_like(y), *([cls.params(samples)] if params else [])]
        w = np.linalg.lstsq(np.stack(cols, 1) / y[:, None], np.ones_like(y), rcond=None)[0]
        return cls(float(w[0]), float(w[1]), len(samples), float(w[2]) if params else 0.0)

    def predict(self, samples) -> np.ndarray:
        """`[N]` predicted ms (at least 1 us)."""
        t = self.a * self.sums(samples) + self.c
        if self.e:
            t = t + self.e * self.params(samples)
        return np.maximum(t, 1e-3)

    def to_json(self) -> dict:
        return dict(a=self.a, c=self.c, samples=self.samples, **({"e": self.e} if self.e else {}))

    @classmethod
    def from_json(cls, d: dict) -> OpSumLine:
        return cls(float(d["a"]), float(d["c"]), int(d.get("samples", 0)), float(d.get("e", 0.0)))


def attach(seqs, model: CostModel, progress: bool = False) -> int:
    """Gives every sequence its operators' predicted ms (`meta["op_ms"]`, the features'
    fourth per-operator dimension); each distinct sequence once. Returns how many."""
    from tqdm import tqdm

    todo = {id(q): q for q in seqs}.values()
    for q in tqdm(todo, desc="operator times", disable=not progress):
        q.meta[OP_MS] = [round(float(v), 6) for v in model.sequence_ms(q)]
    return len(todo)


def load_cost_model(checkpoint: str | Path) -> CostModel | None:
    """The kernel cost model a checkpoint carries (`COST_MODEL`), or None."""
    path = Path(checkpoint) / COST_MODEL
    return CostModel.load(path) if path.exists() else None
