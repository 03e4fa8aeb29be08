"""Measured whole training steps on GPUs, each with its spec-sheet price: what the learned
correction of that price (`gpu.correction`) trains and is scored on.

A row's operator sequence carries each operator's spec-sheet ms on the row's GPU at its
precision (`meta["op_ms"]`, the fourth per-operator dimension), so that the same graph on two
GPUs is two token sequences. Sources, each read where it lies:
- a dataset of measured steps (`mdot dataset`: timm's RTX 3090 table, our GPU kit's sets),
  priced as `mdot predict --device` prices it (train step, SGD with momentum);
- NeuSight's single-GPU training labels (forward and backward, no update), priced from the
  ONNX exports `benchmarks/bench_gpu_ops.py --onnx CACHE` keeps (2 and 4 of a model's layers,
  extended linearly to the label's layers; the tokens are the 4-layer graph's).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from converters import ConversionError, OperatorSequence, convert
from mdot_jax.data.dataset import OP_MS, load_dataset
from mdot_jax.gpu import catalog as gpus
from mdot_jax.gpu import neusight
from mdot_jax.gpu.spec_sheet import StepModel, price
from mdot_jax.serving.prediction import Prediction


@dataclass(frozen=True)
class GpuStep:
    """One measured training step on a GPU and its spec-sheet price."""

    source: str  # where the label comes from
    arch: str
    gpu: str  # catalog name
    precision: str
    batch: int
    input_size: int  # image side or tokens
    seq: OperatorSequence  # fused; meta["op_ms"]: each operator's spec-sheet ms on `gpu`
    phases: dict  # spec-sheet ms by phase (forward, backward, update, launch gaps)
    measured_ms: float

    @property
    def physics_ms(self) -> float:
        return float(sum(self.phases.values()))

    @property
    def transformer(self) -> bool:
        """Token input (a transformer) rather than images (a CNN or a vision transformer)."""
        return self.seq.input_kind == "tokens"


def priced(seq: OperatorSequence, gpu: gpus.GPU, model: StepModel, **how
           ) -> tuple[OperatorSequence, Prediction]:
    """`seq` with each operator's spec-sheet ms on `gpu` as `meta["op_ms"]`, and the price."""
    p = price(seq, gpu, model, fit=False, **how)
    ms = p.node_ms(seq.num_ops).tolist()
    return dataclasses.replace(seq, meta={**seq.meta, OP_MS: ms}), p


def from_dataset(root: str | Path, device: str, model: StepModel, source: str
                 ) -> list[GpuStep]:
    """Every sample of a dataset of measured steps on `device`, priced."""
    gpu = gpus.find(device)
    rows = []
    for s in load_dataset(root).samples:
        seq, p = priced(s.seq, gpu, model, precision=s.workload.precision, step="train",
                        optimizer="sgd", layout=s.workload.layout)
        rows.append(GpuStep(source, s.arch, gpu.name, s.workload.precision,
                            s.workload.batch_size, s.workload.input_size, seq,
                            dict(p.phases), float(s.label_ms)))
    return rows


def from_neusight(root: str | Path, cache: str | Path, model: StepModel
                  ) -> tuple[list[GpuStep], dict[str, str]]:
    """NeuSight's training labels priced from the exports in `cache`; (rows, {label: why not
    priced})."""
    rows, skipped = [], {}
    for lab in neusight.train_labels(root):
        gpu, name = gpus.find(lab["gpu"]), f"{lab['gpu']} {lab['model']}-{lab['seq_len']}"
        try:
            ps = {k: priced(convert(Path(cache) / f"{lab['model']}-{lab['seq_len']}-{k}.onnx",
                                    batch_size=lab["batch"], fuse=True),
                            gpu, model, step="fwd-bwd") for k in (2, 4)}
        except (ConversionError, FileNotFoundError) as e:
            skipped[f"{name} b{lab['batch']}"] = str(e)
            continue
        f = (lab["layers"] - 2) / 2  # a sum over operators: exact in the layers
        phases = {k: v + f * (ps[4][1].phases[k] - v) for k, v in ps[2][1].phases.items()}
        rows.append(GpuStep("neusight", lab["model"], gpu.name, "fp32", lab["batch"],
                            lab["seq_len"], ps[4][0], phases, lab["ms"]))
    return rows, skipped
