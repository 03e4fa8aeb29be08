"""What a prediction answers (`Prediction`: the step's time, its band, memory, phases and what
the request asked) and a device adaptation's fit (`Adaptation`)."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mdot_jax.readable import count, hours, number, percent, plural, span

SPEC_SHEET = "priced from its spec sheet"  # how `Prediction.source` of a spec sheet's begins
# the operators (type `launch gaps`) of a step's host gaps by where they fall on its timeline:
# the forward's and the backward's (each micro-batch's), and what the update's kernels add (once
# an iteration however many micro-batches it accumulates)
GAPS = {part: f"the GPU waiting on the host to issue the {part}"
        for part in ("forward", "backward", "update")}
# a step estimated within this share of its device's memory is tight: estimates of measured
# peaks err by up to about a fifth, either way
TIGHT = 0.9
_LAYER_INDEX = re.compile(r"(?<=\.)\d+(?=/)")  # an exporter's scope: /model/layers.3/...


def by_layer(operators: list[dict]) -> list[dict]:
    """`operators` (`Prediction.operators`) summed over the layers of a stack: those of one type
    whose names differ only in a layer's index (the exporter's scopes: `/model/layers.3/mlp/...`)
    as one, named with `*` for the index, with how many (`count`); the costliest first."""
    groups: dict[tuple[str, str], dict] = {}
    for o in operators:
        name = _LAYER_INDEX.sub("*", str(o["name"]))
        g = groups.setdefault((o["type"], name), dict(type=o["type"], name=name, ms=0.0,
                                                      count=0))
        g["ms"] += o["ms"]
        g["count"] += 1
    return sorted(groups.values(), key=lambda g: -g["ms"])


@dataclass(frozen=True)
class Adaptation:
    """A device adaptation in a checkpoint's metadata (`serving.adaptation.fit` makes one):
    base predictions t become exp(a + b * log t) for `device` (fits `scale`, `affine`), or a
    GPU step is priced again with every kernel at exp(a) times its price and the host issuing
    one every `host_ms` (fit `machine`); with the band of its leave-one-out residuals."""

    device: str  # the device the adapted checkpoint predicts for
    fit: str  # scale | affine | machine
    a: float
    b: float
    n_rows: int
    loo_mape: float  # percent: each row predicted by a fit on the other jobs
    lo: float  # 10th / 90th percentile of the leave-one-out log(measured / predicted)
    hi: float
    source: str = ""
    host_ms: float | None = None  # machine: the host's time to issue a kernel
    base_mape: float | None = None  # percent: the unadapted predictions' error on the rows

    def apply(self, ms: np.ndarray) -> np.ndarray:
        """`[N]` base predictions (ms) -> `[N]` predictions for `device` (ms)."""
        if self.fit == "machine":
            raise ValueError("a machine adaptation prices a step's kernels again, not its time")
        return np.exp(self.a + self.b * np.log(np.asarray(ms, np.float64)))

    def said(self) -> str:
        """The fit in words."""
        if self.fit == "machine":
            return (f"machine fit: kernels at {math.exp(self.a):.2f}x their price, one issued "
                    f"every {1e3 * (self.host_ms or 0.0):.0f} us")
        return f"{self.fit} fit: log t' = {self.a:.3f} + {self.b:.3f} log t"

    def interval(self, ms: float) -> tuple[float, float]:
        return ms * float(np.exp(self.lo)), ms * float(np.exp(self.hi))

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> Adaptation:
        """`to_json`'s dict; fields a later version added are left out."""
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})


# the JSON's keys beyond the fields (`to_json`), each a property's (its docstring says it)
DERIVED = {"replicas": "replicas", "global_batch": "global_batch",
           "samples_per_s": "samples_per_s", "tokens_per_s": "tokens_per_s",
           "tokens_per_s_per_gpu": "tokens_per_s_per_gpu",
           "scaling_efficiency": "scaling_efficiency", "memory_tight": "tight"}


@dataclass
class Prediction:
    """One training iteration (and job) predicted, as `predict` answers a `TrainingJob`.

    Attributes:
      iteration_ms: one iteration: `grad_accum` micro-batches of `batch_size` on each
        data-parallel replica and one update, ms.
      device: the device predicted for (a catalogued GPU's name, or a checkpoint's device).
      num_ops: operators of the converted model priced.
      warnings: what is extrapolated, assumed or unmeasured, one line each.
      parts: with a companion, each member's own prediction by its architecture ({"gnn": ms,
        "lightgbm": ms}; "mdot" for an MDOT checkpoint; "op-sum" where op-grounded).
      interval_ms: where 80% of the measured times fell, on held-out families, for
        predictions like this one (the checkpoint's calibration); null without one, or where
        a warning says this prediction is unlike those.
      band_from: what the band was measured on, in words (with `interval_ms` only).
      operators: where the time goes, with `operators` asked: [{"type", "name", "ms"}] in graph
        order.
      input_size: the workload's image side or sequence length, as predicted for.
      memory_gb: the step's estimated peak memory a GPU, GB (`serving.memory.step_memory`).
      memory_parts: of it, GB by what holds it (`memory.MEMORY_PARTS`: model_states,
        activations, working); empty where not known.
      memory_peak: where its live bytes are followed (a CPU's), the moment of the step they
        are at ("the forward", "the backward", "the update"); null: the sum form's peak.
      memory_limit_gb: the device's memory it was held to.
      fits_with: where it does not fit, the job's changes that would, each priced
        (`serving.fits.suggest`: {"change", "memory_gb", "iteration_ms", "tight"}).
      host_memory_gb: what a node's host holds for it (an offloaded optimizer's).
      phases: priced from a GPU's spec sheet, ms of the forward, backward, update, and where
        they apply recomputation, launch gaps, the communication that shows, a pipeline's
        bubble; they sum to `iteration_ms`.
      batch_size: per data-parallel replica and micro-batch.
      gpus: in all, over every node.
      tp: tensor-parallel GPUs of a replica.
      pp: pipeline stages of a replica.
      cp: GPUs a replica's sequences are cut over (context parallelism).
      grad_accum: micro-batches an iteration accumulates before its update.
      tokens: per sample, for a token model (its sequence length); 0 otherwise.
      parameters: the model's, every layer counted (tied weights once).
      trained_parameters: of those, the ones the update trains (not frozen).
      mfu: model FLOPs utilisation: the model's FLOPs' time at the GPUs' peaks over the
        iteration's.
      source: which predictor: a checkpoint's name, or a spec sheet's step model.
      operators_from: what priced `operators`.
      job_s: the whole job (epochs x dataset size, or the tokens asked), s.
      job_interval_s: the whole job's 80% band, s (with `interval_ms` only).
    """

    iteration_ms: float
    device: str
    num_ops: int
    warnings: list[str] = field(default_factory=list)
    parts: dict[str, float] = field(default_factory=dict)
    interval_ms: tuple[float, float] | None = None
    band_from: str = ""
    operators: list[dict] | None = None
    input_size: int = 0
    memory_gb: float = 0.0
    memory_parts: dict[str, float] = field(default_factory=dict)
    memory_peak: str | None = None
    memory_limit_gb: float | None = None
    fits_with: list[dict] | None = None
    host_memory_gb: float | None = None
    phases: dict[str, float] = field(default_factory=dict)
    batch_size: int = 0
    gpus: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    grad_accum: int = 1
    tokens: int = 0
    parameters: int = 0
    trained_parameters: int = 0
    mfu: float | None = None
    source: str = ""
    operators_from: str = ""
    job_s: float | None = None
    job_interval_s: tuple[float, float] | None = None

    @property
    def replicas(self) -> int:
        """Data-parallel replicas: the GPUs over the tensor-, pipeline- and context-parallel
        ones."""
        return max(self.gpus // (self.tp * self.pp * self.cp), 1)

    @property
    def fits(self) -> bool:
        """Whether the step's estimated memory is within its device's (unknown: it fits)."""
        return self.memory_limit_gb is None or self.memory_gb <= self.memory_limit_gb

    @property
    def tight(self) -> bool:
        """Whether the step fits its device's memory with less than `1 - TIGHT` of it spare."""
        return self.fits and self.memory_limit_gb is not None and \
            self.memory_gb > TIGHT * self.memory_limit_gb

    @property
    def global_batch(self) -> int:
        """Samples an iteration trains on: the batch x the replicas x the micro-batches."""
        return self.batch_size * self.replicas * self.grad_accum

    @property
    def samples_per_s(self) -> float:
        """Samples trained a second, over every GPU."""
        return 1e3 * self.global_batch / self.iteration_ms

    @property
    def tokens_per_s(self) -> float | None:
        """Tokens trained a second, over every GPU (a token model's; else null)."""
        return self.samples_per_s * self.tokens if self.tokens else None

    @property
    def tokens_per_s_per_gpu(self) -> float | None:
        """What LLM runs report: the tokens an iteration trains over its time, a GPU's share."""
        every = self.tokens_per_s
        return every / self.gpus if every is not None else None

    @property
    def scaling_efficiency(self) -> float:
        """The share of a parallel step not waiting on communication or a pipeline's bubble,
        in (0, 1]: for DDP the one-GPU step over the N-GPU one. A throughput ratio would pass
        100% under FSDP, whose GPUs each update 1/N of the parameters where one GPU updates
        them all."""
        idle = self.phases.get("communication", 0.0) + self.phases.get("bubble", 0.0)
        return 1.0 - idle / self.iteration_ms

    def __str__(self) -> str:
        """What `print(prediction)` shows (a notebook's): the iteration and its band, memory
        against the device's, the rates, where the time goes, the job; the warnings counted
        (`warnings` holds them; `repr` every field)."""
        band = f" (80% band {span(*self.interval_ms)} ms)" if self.interval_ms else ""
        on = f"{plural(self.gpus, 'GPU')} of " * (self.gpus > 1) + self.device
        limit = self.memory_limit_gb
        room = "" if limit is None else f" of {number(limit)} GB" + (
            ": does not fit" if not self.fits else ": tight, may not fit" if self.tight else "")
        rates = [f"{number(self.samples_per_s)} samples/s"] + [
            f"{number(t)} tokens/s a GPU" for t in (self.tokens_per_s_per_gpu,) if t] + [
            f"MFU {percent(self.mfu)}" for _ in (self.mfu,) if self.mfu is not None]
        lines = [f"{number(self.iteration_ms)} ms an iteration{band} on {on}",
                 f"memory {number(self.memory_gb)} GB a GPU{room}", ", ".join(rates)]
        if not self.fits:
            lines.append("fits with " + "; or ".join(
                ", ".join(f"{k} {v}" for k, v in f["change"].items())
                + f" ({number(f['memory_gb'])} GB, {number(f['iteration_ms'])} ms)"
                for f in self.fits_with) if self.fits_with else "nothing priced fits"
                if self.fits_with is not None else
                "what would fit: `serving.fits.suggest(job, prediction)`")
        if self.phases:
            lines.append(self.phases_said())
        if self.job_s is not None:
            lo, hi = self.job_interval_s or (0.0, 0.0)
            lines.append(f"the job: {hours(self.job_s / 3600)} h" + (
                f" (80% band {span(lo / 3600, hi / 3600, hours)} h)" if hi else "")
                + f", {self.job_said()}")
        if self.warnings:
            lines.append(f"{plural(len(self.warnings), 'warning')} (.warnings)")
        return "\n".join(lines)

    def job_said(self) -> str:
        """What the job was read as: `62,500,000 iterations of 16 samples, 1.02T tokens` (a
        dataset of tokens given as samples shows)."""
        n = round((self.job_s or 0.0) * 1e3 / self.iteration_ms)
        return f"{plural(n, 'iteration')} of {plural(self.global_batch, 'sample')}" + (
            f", {count(n * self.global_batch * self.tokens)} tokens" if self.tokens else "")

    def phases_said(self, figures: int = 3) -> str:
        """Where the time goes, in words: `of which forward 261 ms, backward 490 ms, ...`."""
        return "of which " + ", ".join(f"{k} {number(v, figures)} ms"
                                       for k, v in self.phases.items())

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython's and Jupyter's display of a cell's value: `str`'s lines (`repr` keeps
        every field)."""
        printer.text(str(self))

    def node_ms(self, nodes: int) -> np.ndarray:
        """`[nodes]` ms of each node of the priced sequence, the casts around it included (the
        operators with an `index`; the update and the host's gaps are on no node)."""
        on = [(o["index"], o["ms"]) for o in self.operators or [] if "index" in o]
        index, ms = zip(*on) if on else ((), ())
        return np.bincount(np.asarray(index, np.int64), np.asarray(ms, np.float64), nodes)

    def gaps(self, part: str) -> float:
        """ms of the phase `launch gaps` that fall in `part` (`GAPS`: the forward, the backward,
        each micro-batch; the update, once an iteration)."""
        return sum(o["ms"] for o in self.operators or [] if o["name"] == GAPS[part])

    def passes_ms(self, micro_batches: int = 1) -> tuple[float, float]:
        """ms of a micro-batch's forward and backward (its recomputation too) on the GPU's
        timeline, of an iteration of `micro_batches`: their kernels and the host's gaps where
        they fall (`gaps`; where the operators do not say, in the share of the kernels' time),
        the update's gaps in neither."""
        fw, bw = (sum(self.phases.get(ph, 0.0) for ph in pass_) / micro_batches
                  for pass_ in (("forward",), ("backward", "recomputation")))
        waits = max(0.0, self.phases.get("launch gaps", 0.0) - self.gaps("update"))
        first, then = self.gaps("forward"), self.gaps("backward")
        share = first / (first + then) if first + then > 0 else fw / max(fw + bw, 1e-30)
        return (fw + share * waits / micro_batches, bw + (1 - share) * waits / micro_batches)

    def with_phases(self, phases: dict[str, float], **changes) -> Prediction:
        """`self` with other phases: the time is their sum and the band, a relative one,
        scales with it."""
        total = sum(phases.values())
        scale = total / self.iteration_ms
        band = self.interval_ms and (self.interval_ms[0] * scale, self.interval_ms[1] * scale)
        return dataclasses.replace(self, phases=phases, iteration_ms=total, interval_ms=band,
                                   **changes)

    def with_memory(self, **gb: float) -> Prediction:
        """`self` with GB added to (or taken from) parts of its memory, the total with them."""
        parts = dict(self.memory_parts)
        for k, v in gb.items():
            parts[k] = parts.get(k, 0.0) + v
        return dataclasses.replace(self, memory_parts=parts,
                                   memory_gb=self.memory_gb + sum(gb.values()))

    def to_json(self) -> dict:
        """The fields and the derived rates, as `mdot predict --json` prints them."""
        d = {k: v for k, v in dataclasses.asdict(self).items()
             if v is not None or k in ("interval_ms",)}
        if self.operators is None:
            d.pop("operators_from")
        if self.interval_ms is None:
            d.pop("band_from")
        if self.job_s is None:
            d.pop("job_interval_s", None)
        return dict(d, **{k: getattr(self, name) for k, name in DERIVED.items()})

    def job_seconds(self, epochs: float, dataset_size: int, batch_size: int) -> float:
        """Whole job: its iterations (`iterations`) * an iteration."""
        return self.iteration_ms * iterations(epochs, dataset_size, batch_size) / 1e3

    def job_interval_seconds(self, epochs: float, dataset_size: int, batch_size: int
                             ) -> tuple[float, float] | None:
        """The whole job's 80% band (`interval_ms` scaled like `job_seconds`), if any."""
        n = iterations(epochs, dataset_size, batch_size)
        if self.interval_ms is None:
            return None
        return self.interval_ms[0] * n / 1e3, self.interval_ms[1] * n / 1e3


def iterations(epochs: float, dataset_size: int, batch_size: int) -> int:
    """A job's iterations: ceil(dataset / batch) an epoch (the last batch partial), a fraction
    of epochs rounded up to whole iterations (as transformers' Trainer counts its steps)."""
    for name, v in (("epochs", epochs), ("dataset_size", dataset_size),
                    ("batch_size", batch_size)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or v <= 0:
            raise ValueError(f"{name} {v!r}: a job needs a positive number")
    return math.ceil(round(math.ceil(dataset_size / batch_size) * epochs, 6))
