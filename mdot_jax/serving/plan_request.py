"""A planning request (`Plan`): a training job and the GPUs, counts, prices and limits to rank
it over (`plan.plan`), checked when made: a bad value is a `RequestError` naming the field."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from mdot_jax.errors import RequestError, fields_named
from mdot_jax.options import STRATEGIES
from mdot_jax.serving.fields import (
    boolean,
    choice,
    plain_fields,
    positive,
    positive_int,
    positive_ints,
)
from mdot_jax.serving.request import TrainingJob

CHOICES = {"strategies": STRATEGIES}  # a field's values (each of a list's), by field


@fields_named
@dataclass(frozen=True)
class Plan:
    """A planning request: the job priced on every candidate (`plan.plan`).

    Attributes:
      job: the training job, with epochs and dataset_size, or train_tokens; no device_spec
        or checkpoint, and a device only among devices (refused: the plan's devices are
        priced, a job's own would be ignored); its gpus are not read
        (`plan.job_for_plan(**fields)` builds one that names a split or a sharded strategy);
        every GPU at its precision (none named: fp32, the spec sheets' default: `priced`).
      devices: catalogued GPUs (a name several boards share: each of them; one string of
        names with commas); "all": every catalogued GPU.
      gpus: the counts of GPUs per node to price each device at (a count past what a node
        holds: that many whole nodes).
      prices: USD per GPU-hour by device name: what each plan costs.
      deadline_h: the whole job's hours a feasible plan finishes within.
      budget_usd: what a feasible plan may cost (with prices).
      global_batch: samples an iteration, held fixed: each GPU count split every way
        (tensor, pipeline, data parallel, micro-batches; `plan` module docs).
      cps: with global_batch, the context-parallel degrees to try.
      strategies: the data-parallel strategies to try (`options.STRATEGIES`), the best kept.
      roomy: a feasible plan leaves a tenth of each GPU's memory free (`Prediction.tight`:
        estimates of measured peaks err by up to a fifth); a tight one is listed infeasible.
      available: GPUs free by device name (in all, over every node; 0: none): a plan needing
        more of a device is listed infeasible, priced, and the device priced at what is free
        (`counts`); a device it does not name, no limit.
    """

    job: TrainingJob
    devices: Sequence[str] = ("all",)
    gpus: Sequence[int] = (1, 2, 4, 8)
    prices: Mapping[str, float] | None = field(default=None, hash=False)
    deadline_h: float | None = None
    budget_usd: float | None = None
    global_batch: int | None = None
    cps: Sequence[int] = ()
    strategies: Sequence[str] = ()
    roomy: bool = False
    available: Mapping[str, int] | None = field(default=None, hash=False)

    def __post_init__(self):
        if not isinstance(self.job, TrainingJob):
            raise RequestError("job: a TrainingJob", "job")
        plain_fields(self)  # every field but the job
        boolean("roomy", self.roomy)
        for name, instead in (("device_spec", "catalogued GPUs (devices); one it lacks: "
                               "predict the job on it at each count"),
                              ("checkpoint", "GPUs from their spec sheets")):
            if getattr(self.job, name) is not None:  # read by no candidate: said, not ignored
                raise RequestError(f"{name}: a plan prices {instead}, not the job's {name}",
                                   name)
        if self.job.train_tokens is None and self.job.epochs is None:
            raise RequestError("epochs: a plan prices the whole job; give epochs and "
                               "dataset_size, or train_tokens", "epochs")
        for name in ("devices", "strategies"):  # names with commas, as on the command line
            if isinstance(value := getattr(self, name), str):
                object.__setattr__(self, name, tuple(value.split(",")))
        for name in ("devices", "gpus", "cps", "strategies"):  # one, or several
            if isinstance(value := getattr(self, name), (str, bytes, Mapping)) or not hasattr(
                    value, "__len__"):
                object.__setattr__(self, name, (value,))
        if not self.devices or not all(isinstance(d, str) and d for d in self.devices):
            raise RequestError(f"devices {self.devices!r}: name catalogued GPUs, or 'all'",
                               "devices")
        positive_ints("gpus", list(self.gpus))
        if (device := self.job.device) is not None and not self._names(str(device)):
            raise RequestError(f"device: a plan prices each GPU of devices, not the job's "
                               f"device; give devices=[{str(device)!r}] (or no device)", "device")
        for name in ("deadline_h", "budget_usd"):
            if getattr(self, name) is not None:
                positive(name, getattr(self, name))
        for name, example in (("prices", "USD per GPU-hour by device ({'h100-sxm': 3.99})"),
                              ("available", "GPUs free by device ({'h100-sxm': 16})")):
            if not isinstance(getattr(self, name), (Mapping, type(None))):
                raise RequestError(f"{name} {getattr(self, name)!r}: expected {example}", name)
        if self.budget_usd is not None and not self.prices:  # every plan would be "no price"
            raise RequestError("budget_usd: holds the plans to a cost; give prices too (USD "
                               "per GPU-hour by device)", "budget_usd")
        if self.cps:
            positive_ints("cps", list(self.cps))
            object.__setattr__(self, "cps", tuple(dict.fromkeys(self.cps)))  # each once
            if self.global_batch is None or self.job.cp != 1:
                raise RequestError("cps: context-parallel degrees the layout search tries; "
                                   "give global_batch, and no cp of the job's", "cps")
        if self.strategies:
            for s in self.strategies:
                choice("strategies", s, CHOICES["strategies"], optional=False)
            object.__setattr__(self, "strategies", tuple(dict.fromkeys(self.strategies)))
            if self.job.strategy != "ddp":
                raise RequestError("strategies: data-parallel strategies the plan tries; give "
                                   "no strategy of the job's", "strategies")
        if self.global_batch is not None:
            positive_int("global_batch", self.global_batch)
            job = self.job
            fixed = [f for f in ("schedule", "sequence_parallel") if getattr(job, f)] + \
                [f for f in ("tp", "pp", "grad_accum") if getattr(job, f) != 1]
            if fixed:
                raise RequestError(f"global_batch: searches the layouts; give no {fixed[0]} "
                                   "of your own", "global_batch")
        _ = self._prices, self._free  # checked here, each read once for every option

    def candidates(self) -> list:
        """The catalogued GPUs asked, each once: a name several boards share (`h100`, `a100`)
        each of them, as `mdot devices` lists them (an unknown name: its one-line error)."""
        from mdot_jax.gpu import catalog

        if list(self.devices) == ["all"]:
            return list(catalog.catalog().values())
        try:
            return list(catalog.named(self.devices).values())
        except ValueError as e:
            raise RequestError(f"devices: {e}", "devices") from None

    def _names(self, device: str) -> bool:
        """Whether `devices`, named (not "all"), holds the catalogued GPU `device`."""
        from mdot_jax.gpu import catalog

        try:
            return list(self.devices) != ["all"] and catalog.find(device).name in {
                g.name for g in self.candidates()}
        except (ValueError, RequestError):  # no such GPU, or several: not one named
            return False

    @functools.cached_property
    def priced(self) -> TrainingJob:
        """The job every candidate is priced as: at fp32 where it names no precision (every GPU
        at one precision; a GPU's own checkpoint would answer at its own)."""
        return self.job if self.job.precision else dataclasses.replace(self.job, precision="fp32")

    @functools.cached_property
    def _prices(self) -> dict:
        return _by_gpu("prices", self.prices, "price", positive)

    @functools.cached_property
    def _free(self) -> dict:
        return _by_gpu("available", self.available, "count", _gpus_free)

    def price_of(self, gpu) -> float | None:
        """USD per GPU-hour of `gpu` from `prices`, by any of its names."""
        usd = self._prices.get(gpu.name)
        return None if usd is None else float(usd)

    def free_of(self, gpu) -> int | None:
        """How many of `gpu` are free (`available`), by any of its names; None: no limit."""
        return self._free.get(gpu.name)

    def counts(self, gpu) -> list[int]:
        """The GPUs a node `gpu` is priced at: the counts asked and, where fewer of it are
        free than the most asked, the most that are (past a node's GPUs, whole nodes): what a
        scheduler could start now."""
        asked, nodes = list(self.gpus), self.job.nodes
        if (free := self.free_of(gpu)) is None or free >= max(asked) * nodes:
            return asked
        n = free // nodes
        n -= n % gpu.node_gpus if n > gpu.node_gpus else 0
        return asked + [n] if n and n not in asked else asked


def _gpus_free(name: str, value: object) -> None:
    if type(value) is not int or value < 0:  # 0: none free, every count over it
        raise RequestError(f"{name} {value!r}: expected a count of GPUs (0 or more)",
                           name.split("[")[0])


def _by_gpu(field: str, given: Mapping | None, what: str,
            check: Callable[[str, object], None]) -> dict:
    """`given` (device name -> value, each `check`ed) by catalogued GPU name; a name that is
    no GPU, several (`a100`), or a GPU given twice under two names is a `RequestError` naming
    the field."""
    from mdot_jax.gpu import catalog

    out: dict = {}  # GPU -> its value
    named: dict[str, str] = {}  # GPU -> the name its value was given under
    for device, value in (given or {}).items():
        check(f"{field}[{device!r}]", value)
        try:  # a typo would apply to nothing, silently
            gpu = catalog.find(str(device)).name
        except ValueError as e:  # none, or several (`a100`): the catalog's line says
            raise RequestError(f"{field}[{device!r}]: {e}", field) from None
        if (was := named.setdefault(gpu, str(device))) != device:  # one would be ignored
            raise RequestError(f"{field}[{device!r}]: {was!r} is the same GPU ({gpu}); give "
                               f"it one {what}", field)
        out[gpu] = value
    return out
