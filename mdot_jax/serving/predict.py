"""Prediction API: `Predictor.load(checkpoint).predict(model, batch_size=...)` -> ms/iteration.

Compiled once per sequence-length bucket (fixed prediction batch size), then fast.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Union

import jax
import numpy as np
import onnx
from flax import nnx

from converters import OperatorSequence, convert
from converters.dims import check_dims
from converters.kind import LOSSES
from converters.vocab import VOCAB
from mdot_jax.data.dataset import OP_MS, Sample, Workload
from mdot_jax.data.features import FeatureCache, bucket_length
from mdot_jax.errors import RequestError
from mdot_jax.gpu import catalog as gpus
from mdot_jax.kernels.cost_model import COST_MODEL, CostModel, OpSumLine, attach, load_cost_model
from mdot_jax.models.ensemble import combine, spread
from mdot_jax.models.trained import Trained, predict_samples
from mdot_jax.models.trees import TreeModel
from mdot_jax.serving import batch_edge
from mdot_jax.serving.memory import check_fit, machine_memory, step_memory
from mdot_jax.serving.model_facts import check_converted, graph_warnings, input_size_of
from mdot_jax.serving.prediction import Adaptation, Prediction
from mdot_jax.storage.calibration import Calibration
from mdot_jax.storage.checkpoint import CheckpointError, load, load_companion
from mdot_jax.storage.shipped import (
    SHIPPED_DIR,
    STEP_MODEL_DIR,
    resolve_checkpoint,
    shipped_checkpoints,
)

CHECKPOINT_DIR = SHIPPED_DIR
PREDICT_TOKENS = 4096

ModelLike = Union[str, Path, bytes, onnx.ModelProto, OperatorSequence]


class Predictor:
    """A trained network (MDOT, GNN, ...: `ModelConfig.arch`) with its feature pipeline, and
    the checkpoint's LightGBM companion if it has one and, op-grounded, its operator-sum line
    (the prediction is then the geometric mean of the members); thread-compatible, not
    thread-safe."""

    def __init__(self, trained: Trained, path: Path | None = None,
                 companion: TreeModel | None = None):
        self.trained, self.path, self.companion = trained, path, companion
        graphdef, params = trained.graphdef, trained.params

        @jax.jit
        def forward(params, batch):
            return nnx.merge(graphdef, params)(batch, train=False)[0]

        self._params = jax.device_put(params)
        self._forward = forward
        line = self.metadata.get("op_sum")
        # the third member, with the companion only (`companion=False`: the network alone)
        self.op_sum = OpSumLine.from_json(line) if line and companion is not None else None
        cal = self.metadata.get("calibration")
        cal = Calibration.from_json(cal) if cal else None
        # bands of the prediction this predictor makes: of the network alone, or with its
        # other members
        self.calibration = cal if cal and len(cal.methods) == len(self.members) else None
        adapted = self.metadata.get("adaptation")
        # fitted to another device's measurements: predictions are for that device, with the
        # band of the fit's leave-one-out errors (`mdot adapt`)
        self.adaptation = Adaptation.from_json(adapted) if adapted else None
        # op-grounded checkpoints carry the kernel cost model their features come from
        self.cost_model = load_cost_model(path) if path else None
        if trained.feature_cfg.op_costs and self.cost_model is None:
            raise CheckpointError(f"{path}: trained on predicted operator times, but its "
                                  f"kernel cost model ({COST_MODEL}) is missing")

    @classmethod
    def load(cls, name_or_dir: str | Path | None = None, *, companion: bool = True
             ) -> Predictor:
        """`companion=False` predicts with the network alone even if the checkpoint has a
        companion (and an operator-sum line)."""
        path = resolve_checkpoint(name_or_dir)
        return cls(load(path), path, load_companion(path) if companion else None)

    @property
    def members(self) -> list[str]:
        """What the prediction is the geometric mean of: the network's architecture, then
        "lightgbm" and "op-sum" when present (the keys of `Prediction.parts`)."""
        return [self.trained.model_cfg.arch, *(["lightgbm"] if self.companion else []),
                *(["op-sum"] if self.op_sum else [])]

    @property
    def member_labels(self) -> list[str]:
        """`members` as people read them: "GNN", "LightGBM", "the operator sum"."""
        names = {"lightgbm": "LightGBM", "op-sum": "the operator sum"}
        return [self.trained.model_cfg.label, *(names[m] for m in self.members[1:])]

    @property
    def devices(self) -> list[str]:
        """The devices this predictor was trained on (what it can predict for)."""
        return list(self.trained.stats.devices)

    @property
    def metadata(self) -> dict:
        return self.trained.info.get("metadata", {})

    def _workload(self, batch_size: int, input_size: int, precision: str | None, layout: str,
                  device: str | None, optimizer: str) -> Workload:
        devices = self.devices
        device = device or (devices[0] if len(devices) == 1 else None)
        if device not in devices:
            device = self._checkpoint_device(device)
        if precision is None:
            precision = "amp-fp16" if device.startswith(("rtx", "a100", "v100", "h100")) \
                else "fp32"
        return Workload(batch_size=batch_size, input_size=input_size, precision=precision,
                        layout=layout, device=device, optimizer=optimizer)

    def _checkpoint_device(self, name: str | None) -> str:
        """`name` as one of this checkpoint's devices: the same catalogued GPU under another
        name (`nvidia-rtx-3090` for `rtx3090`), else a ValueError saying what is known."""
        devices = self.devices
        if name is None:
            raise ValueError(f"this checkpoint predicts for {devices}: name one")
        if name.lower().startswith("cpu") and name not in devices:
            if name.lower() == "cpu" and len(devices) == 1 and devices[0].startswith("cpu"):
                return devices[0]  # the CPU this checkpoint was measured on
            cpus = [n for n in shipped_checkpoints() if n.startswith("cpu")]
            raise ValueError(f"device {name!r}: a CPU is predicted by a checkpoint measured on "
                             f"one (checkpoint {' or '.join(cpus)}; `mdot adapt` makes one for "
                             "yours from its probe)")
        try:
            gpu = gpus.find(name)
        except ValueError as e:
            raise ValueError(f"device {name!r}: {e}; this checkpoint predicts for {devices}"
                             ) from None
        for d in devices:
            if (same := gpus.lookup(d)) and same.name == gpu.name:
                return d
        raise ValueError(f"{gpu.name} is in the GPU catalog, but this checkpoint predicts for "
                         f"{devices} only: without --checkpoint, `mdot predict --device "
                         f"{gpu.name}` prices it from its spec sheet")

    def sequence(self, model: ModelLike, *, batch_size: int, image_size: int | None = None,
                 seq_len: int | None = None, input_shapes: dict | None = None
                 ) -> OperatorSequence:
        if isinstance(model, OperatorSequence):
            check_converted(model, batch_size, image_size, seq_len)
            return model
        return convert(model, batch_size=batch_size, image_size=image_size, seq_len=seq_len,
                       input_shapes=input_shapes, fuse=int(self.trained.feature_cfg.fused))

    def read(self, seq: OperatorSequence) -> tuple[OperatorSequence, str | None]:
        """`seq` less the loss that ends it where this checkpoint read no loss operator: the
        graphs it read ended at their outputs, and the steps it learned were measured with
        their loss (a Hugging Face classifier's config exports its loss); what was left out,
        in words (None: nothing)."""
        seen, names, k = self.trained.info.get("op_types"), seq.op_names, seq.num_ops
        while seen and k > 1 and names[k - 1] in LOSSES and names[k - 1] not in seen:
            k -= 1
        if k == seq.num_ops:
            return seq, None
        return prefix(seq, k), (
            f"the model's loss ({', '.join(dict.fromkeys(names[k:]))}) left out of its graph: "
            "this checkpoint read graphs that end at their outputs, and learned steps "
            "measured with their loss")

    def predict(self, model: ModelLike, *, batch_size: int, image_size: int | None = None,
                seq_len: int | None = None, input_shapes: dict | None = None,
                precision: str | None = None, layout: str = "nchw", device: str | None = None,
                optimizer: str = "sgd",
                at_batch: Callable[[int], OperatorSequence] | None = None) -> Prediction:
        """Milliseconds per training iteration of `model` (an `.onnx` path, ModelProto or
        OperatorSequence already at `batch_size`). A batch past the largest trained one is
        priced from the model at that batch and its half (`batch_edge`): converted here, or
        by `at_batch` (a sequence's own model at another batch), else extrapolated."""
        if batch_size is None:
            raise RequestError("batch_size: required (the batch per device)", "batch_size")
        check_dims(batch_size=batch_size, image_size=image_size, seq_len=seq_len)
        seq, said = self.read(self.sequence(model, batch_size=batch_size,
                                            image_size=image_size, seq_len=seq_len,
                                            input_shapes=input_shapes))
        size = image_size or seq_len or input_size_of(seq)
        w = self._workload(batch_size, size, precision, layout, device, optimizer)
        if at_batch is None and not isinstance(model, OperatorSequence):
            def at_batch(n: int) -> OperatorSequence:
                return self.sequence(model, batch_size=n, image_size=image_size,
                                     seq_len=seq_len, input_shapes=input_shapes)
        edge = batch_edge.edge(self.trained.info.get("batch_sizes"), batch_size)
        pair = edge and at_batch and (self.read(at_batch(edge // 2))[0],
                                      self.read(at_batch(edge))[0])
        p = self.predict_many([(seq, w)], [pair or None])[0]
        p.warnings += [said] if said else []  # not one that withholds the band
        return p

    def predict_many(self, items: Sequence[tuple[OperatorSequence, Workload]],
                     grow: Sequence[tuple[OperatorSequence, OperatorSequence] | None] = ()
                     ) -> list[Prediction]:
        """Batch prediction for many (sequence, workload) pairs at once. The caller's
        sequences are not changed: operator times go on this call's copies. `grow[i]`: item
        i's model at the half of the largest trained batch and at it, where its batch is past
        that (`batch_edge`): the item is priced from them, grown as their doubling did."""
        asked = len(items)
        edges = [batch_edge.edge(self.trained.info.get("batch_sizes"), w.batch_size) or 0
                 for _, w in items]
        extra = [(i, asked + 2 * k) for k, i in enumerate(
            i for i, g in enumerate(grow) if g and edges[i])]
        items = [*items, *((s, replace(items[i][1], batch_size=edges[i] // n))
                           for i, _ in extra for s, n in zip(grow[i] or (), (2, 1)))]
        fc = self.trained.feature_cfg
        own: dict[int, OperatorSequence] = {}  # id -> a copy without another model's times
        for seq, _ in items:
            if id(seq) not in own:
                own[id(seq)] = replace(
                    seq, meta={k: v for k, v in seq.meta.items() if k != OP_MS})
        if self.cost_model is not None and fc.op_costs:
            attach(list(own.values()), self.cost_model)
        items = [(own[id(seq)], w) for seq, w in items]
        samples = [Sample.in_memory(seq, w, key=str(i)) for i, (seq, w) in enumerate(items)]
        for seq, w in items:
            if w.device not in self.devices:  # an unknown device would be no device at all
                raise ValueError(f"this checkpoint predicts for {self.devices}, not "
                                 f"{w.device!r}")
            bucket_length(seq.num_ops, fc.buckets)  # a clear error if too long
            if seq.fusion != fc.fused:
                raise ValueError(f"operator sequence {seq.name!r} was converted with fusion "
                                 f"version {seq.fusion}, this checkpoint expects {fc.fused} "
                                 "(0: unfused; convert it with fuse=that version)")
        # features of this call's sequences only: a Predictor outlives the sequences it saw
        cache = FeatureCache(self.trained.stats, fc, self.trained.model_cfg.vocab_size)
        out = predict_samples(self._forward, self._params, cache, samples, PREDICT_TOKENS,
                              shrink=True)
        parts: list[dict] = [{} for _ in items]
        disagreement: list[float | None] = [None] * len(items)
        if self.companion is not None:
            members = [out, self.companion.predict(samples),
                       *([self.op_sum.predict(samples)] if self.op_sum else [])]
            parts = [{m: float(v) for m, v in zip(self.members, vs)} for vs in zip(*members)]
            disagreement = [float(d) for d in spread(*members)]
            out = combine(*members)
        adapted, base = self.adaptation, np.array(out, dtype=float)
        growth: dict[int, float] = {}
        for i, h in extra:  # from the model at the edge's half (h) and at the edge (h + 1)
            growth[i] = batch_edge.growth(base[h], base[h + 1], items[i][1].batch_size / edges[i])
            base[i], parts[i], disagreement[i] = base[h + 1] * growth[i], {
                m: v * growth[i] for m, v in parts[h + 1].items()}, disagreement[h + 1]
        out = adapted.apply(base) if adapted else base
        preds = []
        for i, (ms, part, d, (seq, w)) in enumerate(zip(out, parts, disagreement, items[:asked])):
            edge_ms = float(base[i] / growth[i]) if i in growth else float(base[i])
            p = Prediction(float(ms), adapted.device if adapted else w.device, seq.num_ops,
                           self.warnings(seq, w, growth.get(i)) + self._outside_labels(edge_ms, w),
                           part, input_size=w.input_size)
            cal = self.calibration
            band = cal.band(w.layout, d) if cal else None
            if adapted and not p.warnings:
                p.interval_ms = adapted.interval(p.iteration_ms)
                p.band_from = (f"the {adapted.n_rows} steps measured on {adapted.device}, "
                               "each priced by a fit on the others")
            if cal and band and not p.warnings:
                if not p.interval_ms:
                    p.interval_ms = band.interval(p.iteration_ms)
                    p.band_from = "model families the predictor had not seen"
                if d is not None and band is cal.bands[w.layout][-1]:
                    names = self.member_labels
                    p.warnings.append(
                        f"{', '.join(names[:-1])} and {names[-1]} disagree by "
                        f"{math.expm1(d):.0%}: on held-out families, predictions whose "
                        f"members disagreed by {cal.labels(w.layout)[-1]} erred by "
                        f"{band.median_ape:.0f}% (median)")
            if p.interval_ms and len(part) > 1:  # a band always holds every member's
                span = np.asarray(list(part.values()))  # prediction, however far apart
                span = adapted.apply(span) if adapted else span
                p.interval_ms = (min(p.interval_ms[0], float(span.min())),
                                 max(p.interval_ms[1], float(span.max())))
            self._check_memory(p, seq, w)
            preds.append(p)
        return preds

    def _outside_labels(self, ms: float, w: Workload) -> list[str]:
        """A prediction (`ms`, before any adaptation) faster or slower than every step the
        checkpoint was trained on: each input may be in range while the step is not (a small
        model at a small batch, on a checkpoint of big steps). The hint where a spec sheet
        prices the device."""
        trained = self.trained.info.get("label_ms")  # absent from checkpoints before the rule
        if not trained or trained[0] <= ms <= trained[1]:
            return []
        try:
            hint = f"; its spec sheet prices any step: device {gpus.find(w.device).name}, " \
                   f"precision {w.precision}, checkpoint {STEP_MODEL_DIR.name}"
        except ValueError:
            hint = ""
        said = f"{ms:.3g} ms{' (before adaptation)' if self.adaptation else ''}"
        return [f"{said} is {'faster' if ms < trained[0] else 'slower'} than every step this "
                f"checkpoint was trained on ({trained[0]:g}-{trained[1]:g} ms): "
                f"extrapolation{hint}"]

    def _check_memory(self, p: Prediction, seq: OperatorSequence, w: Workload) -> None:
        """Sets the step's memory estimate, and warns where it exceeds the device's memory (a
        catalogued GPU's, or this machine's RAM for a CPU), by `memory.check_fit`."""
        limit: float | None
        try:
            limit, what = gpus.find(p.device).memory_gb, f"the {p.device}'s memory"
        except ValueError:
            ram = machine_memory()
            limit, what = (ram / 1e9 if ram else None), "this machine's RAM"
        memory = step_memory(seq, w.precision, w.optimizer, cpu=what == "this machine's RAM")
        p.memory_gb, p.memory_parts = memory.total / 1e9, memory.parts()
        p.memory_peak = memory.peak or None
        check_fit(p, limit, what)

    def operators(self, seq: OperatorSequence, p: Prediction, batch_size: int
                  ) -> tuple[list[dict], str]:
        """Where the time of prediction `p` goes: every operator of `seq` with its share of
        `p.iteration_ms` (the kernel cost model's times, scaled so that they and the loss add
        up to the prediction), and which kernel model priced them."""
        kernel, source = self.cost_model, "this checkpoint's kernel cost model"
        if kernel is None:
            kernel, source = nearest_kernel_model(p.device)
        if kernel is None:
            return [], source
        ms = kernel.sequence_ms(seq)
        total = float(ms.sum()) + kernel.loss_ms(batch_size, 1000)
        scale = p.iteration_ms / max(total, 1e-12)
        return [dict(type=VOCAB[t], name=str(n), ms=float(m * scale))
                for t, n, m in zip(seq.op_type, seq.node_names, ms)], source

    def warnings(self, seq: OperatorSequence, w: Workload, growth: float | None = None
                 ) -> list[str]:
        """What makes a prediction less trustworthy (and leaves it without a band): a batch or
        input size outside the range the checkpoint was trained on (a batch past it priced at
        its edge, times `growth`), a layout, precision, optimizer or operator type it never
        saw, operators the converter does not know."""
        info, out = self.trained.info, []
        for what, value in (("batch size", w.batch_size), ("input size", w.input_size)):
            seen = info.get(what.replace(" ", "_") + "s")
            if seen and growth and what == "batch size":
                out.append(batch_edge.said(w.batch_size, seen, growth))
            elif seen and not min(seen) <= value <= max(seen):
                far = value > 10 * max(seen) or value < min(seen) / 10
                out.append(f"{what} {value} is {'far (over 10x) ' if far else ''}outside the "
                           f"trained range {min(seen)}-{max(seen)}: "
                           + ("a guess, not a prediction" if far else "extrapolation"))
        for what, name in (("layout", w.layout), ("precision", w.precision),
                           ("optimizer", w.optimizer)):
            seen = info.get(what + "s")  # absent from the oldest checkpoints
            if seen and name not in seen:
                out.append(f"{what} {name} was never trained on (only {', '.join(seen)}): "
                           "extrapolation")
        kinds = info.get("input_kinds")  # absent from older checkpoints
        if kinds and seq.input_kind not in kinds:
            out.append(f"a model with {seq.input_kind} input, but this checkpoint was trained "
                       f"on {' and '.join(kinds)} models only: extrapolation")
        if seq.unknown_ops:
            out.append(f"operators unknown to the converter count as <unk>: "
                       f"{seq.unknown_ops}")
        trained_ops = info.get("op_types")  # absent from checkpoints older than the rule
        unseen = sorted(set(seq.op_type_counts()) - set(trained_ops or ()) - set(seq.unknown_ops))
        if trained_ops and unseen:
            out.append(f"operators this checkpoint never trained on: {', '.join(unseen)}: "
                       "extrapolation")
        return out + graph_warnings(seq.meta.get("graph") or {}, w.precision)

    def predict_job(self, model: ModelLike, *, batch_size: int, epochs: float,
                    dataset_size: int, **kw) -> float:
        """Seconds for `epochs` over `dataset_size` samples (iterations = ceil(size/batch))."""
        p = self.predict(model, batch_size=batch_size, **kw)
        return p.job_seconds(epochs, dataset_size, batch_size)


def nearest_kernel_model(device: str) -> tuple[CostModel | None, str]:
    """The kernel cost model that a shipped op-grounded checkpoint of `device` carries (a
    shipped checkpoint is named by its device), else another device's (said so), else None;
    and a phrase naming which."""
    from mdot_jax.measure.device import is_cpu

    # another CPU's kernels say little of a GPU's: only a device of the same kind stands in
    cpu = is_cpu(device)
    shipped = [f for f in sorted(CHECKPOINT_DIR.glob(f"*/{COST_MODEL}"))
               if f.parent.name == device or is_cpu(f.parent.name) == cpu]
    if not shipped:
        gpu = None if cpu else gpus.lookup(device)
        return None, f"no kernel cost model of {'a CPU' if cpu else 'a GPU'} is shipped yet" + (
            f"; checkpoint {STEP_MODEL_DIR.name} prices each operator from the {gpu.name}'s "
            "spec sheet" if gpu else "")
    name = {f: f.parent.name for f in shipped}
    own = [f for f in shipped if name[f] == device]
    path = (own or shipped)[0]
    what = "" if own else f"; none of {device} is shipped, so the shares are {name[path]}'s"
    return CostModel.load(path), f"the kernel cost model of {name[path]}{what}"


def prefix(seq: OperatorSequence, k: int) -> OperatorSequence:
    """`seq`'s first `k` operators and the edges between them; its `meta` as it is."""
    keep = seq.edges[:, 1] < k  # [E] (src < dst: both kept)
    return OperatorSequence(seq.name, seq.op_type[:k], seq.config[:k], seq.load[:k],
                            seq.edges[keep], seq.node_names[:k], seq.meta)
