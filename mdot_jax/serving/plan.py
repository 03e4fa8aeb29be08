"""Which GPUs, how many, what it costs, by when: one training job priced on every candidate
(GPU type x GPU count) from the spec sheets, ranked for a scheduler.

The rules:
- a candidate is a catalogued GPU and a count of them per node (`Plan.gpus`, `job.nodes`
  nodes); a count past what one of its nodes holds (its NVLink fabric's GPUs, else an HGX
  board's 8: `whole_nodes`) is that many whole nodes, a count that fills none refused; a GPU
  with fewer free (`Plan.available`) than the most asked is priced at what is free too
  (`Plan.counts`); the
  job's model is converted once, every candidate priced by the front door
  (`front.predict`) with the job's own fields (precision, parallel plan, batch, ...);
- it is feasible when it fits (`Prediction.fits`: its memory within the GPU's; `roomy`: not
  `Prediction.tight` either), finishes by the
  deadline (`deadline_h`, the whole job's time) and costs at most the budget (`budget_usd`:
  the job's hours x GPUs x the device's USD per GPU-hour in `prices`);
- feasible plans first, by cost (by time where no price is known), a job twice as soon worth
  1% more cost and twice the GPUs needing 1% less time (`WORTH`: closer than that, no
  prediction tells two apart), then the others with their reasons; the Pareto front of time
  against cost is what no other plan beats on both.
A candidate that cannot be priced (a precision the GPU lacks, a parallel plan that does not
divide its GPUs) is kept, infeasible, with the one-line reason.

With `global_batch` (samples an iteration, held fixed), each GPU count is also split every way
(`layouts`): tensor parallelism within a node (powers of two), pipeline stages (powers of two),
the job's context parallelism as it gives it (or each of `cps`, the model converted at each's
cut sequence), the data-parallel replicas the rest,
micro-batches of 1, 2, 4, ... up to the job's batch size, it and the largest dividing a
replica's share, accumulated to the global batch;
without a checkpointing asked, a layout that does not fit is priced again with full activation
checkpointing; a mixture of experts (unless the job gives
`ep`) is priced at every expert-parallel degree (powers of two dividing the replicas and the
experts) and the best kept. With `strategies` (with or without `global_batch`), each layout
or GPU count with replicas to shard over is priced under each data-parallel strategy (DDP,
ZeRO, FSDP, HSDP: `options.STRATEGIES`; one the job cannot take is left out) and the best kept.
Splits the model cannot take (tensor parallelism not dividing the
heads or the key-value heads, a pipeline deeper than the layers) are left out; a GPU no split
could be priced on is kept once, infeasible, with the reason, as is a context-parallel degree
of `cps` the model takes on none of a GPU's layouts (a model that reads images).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm

from converters.fusion import fusion_version
from mdot_jax.errors import MdotError, RequestError
from mdot_jax.readable import hours, number, percent, plural
from mdot_jax.serving.front import FP32_DEFAULT, GIVE_PRECISION
from mdot_jax.serving.model_source import cut, model_errors, sequence
from mdot_jax.serving.plan_request import Plan as Plan  # the request, where callers find it
from mdot_jax.serving.prediction import DERIVED, Prediction
from mdot_jax.serving.request import TrainingJob

SPLIT_FIELDS = ("tp", "pp", "ep", "cp", "schedule", "strategy", "sequence_parallel")  # refused


@dataclass(frozen=True)
class Layout:
    """How a count of GPUs is split: `tp` x `pp` x data-parallel replicas, each running
    `grad_accum` micro-batches of `micro_batch` an iteration.

    Attributes:
      tp, pp: tensor- and pipeline-parallel degrees.
      micro_batch: samples a micro-batch, per data-parallel replica.
      grad_accum: micro-batches an iteration (the pipeline's).
      checkpointing: the activation checkpointing priced (null: none).
      ep: a mixture of experts' experts split over this many replicas.
      cp: GPUs each sequence is cut over (context parallelism).
      strategy: of the data-parallel replicas.
    """

    tp: int
    pp: int
    micro_batch: int
    grad_accum: int
    checkpointing: str | None = None
    ep: int = 1
    cp: int = 1
    strategy: str = "ddp"

    def __str__(self) -> str:
        return (f"tp{self.tp} pp{self.pp}" + (f" cp{self.cp}" if self.cp > 1 else "")
                + (f" ep{self.ep}" if self.ep > 1 else "")
                + f" {self.micro_batch}x{self.grad_accum}"
                + (f" {self.strategy}" if self.strategy != "ddp" else "")
                + (f" ckpt-{self.checkpointing}" if self.checkpointing else ""))


def whole_nodes(gpu, n: int, nodes: int) -> tuple[int, int] | str:
    """`n` GPUs a node over `nodes` as `gpu`'s nodes hold them: (GPUs a node, nodes), up to
    its node's GPUs in one (its NVLink fabric's, else an HGX board's), past them whole nodes;
    or why not (a count past a node that fills no whole ones)."""
    node = gpu.node_gpus
    if n <= node:
        return n, nodes
    if n % node:
        return (f"{n * nodes} GPUs: {n} a node do not fill whole nodes of the {gpu.name}'s "
                f"{node} ({'its NVLink joins' if gpu.nvlink_gpus else 'an HGX board holds'} "
                f"{node})")
    return node, nodes * n // node


def layouts(gpus_per_node: int, nodes: int, global_batch: int, micro_batch: int, cp: int = 1
            ) -> list[Layout]:
    """Every split of `gpus_per_node` x `nodes` GPUs the search prices (module docstring),
    before the model says which it takes; micro-batches of powers of two up to `micro_batch`,
    it and the largest dividing a replica's share of the batch (a global batch of 7 on one
    GPU: 7, not only 1); `cp`: the job's context-parallel GPUs a replica spans beside its
    tensor and pipeline ones."""
    total, out = gpus_per_node * nodes, []
    sizes = {1 << i for i in range(micro_batch.bit_length())} | {micro_batch}
    for tp in (t for t in (1, 2, 4, 8, 16) if gpus_per_node % t == 0):
        for pp in (p for p in (1, 2, 4, 8, 16, 32) if total % (tp * p * cp) == 0):
            dp = total // (tp * pp * cp)
            if global_batch % dp:
                continue
            share = global_batch // dp
            largest = max(b for b in range(1, min(micro_batch, share) + 1) if share % b == 0)
            out += [Layout(tp, pp, b, share // b, cp=cp)
                    for b in sorted(sizes | {largest}) if share % b == 0]
    return out


# of a priced option's prediction, the keys its JSON carries (`Prediction.to_json`'s)
ANSWERED = ("iteration_ms", "memory_gb", "mfu", "samples_per_s", "tokens_per_s",
            "tokens_per_s_per_gpu", "memory_tight", "scaling_efficiency", "warnings")


@dataclass
class Option:
    """One candidate: its prediction (None where it could not be priced), the whole job's
    hours and cost, and whether it is feasible (`reasons` say why not).

    Attributes:
      device: the catalogued GPU.
      gpus: in all, over every node.
      prediction: its iteration priced (`Prediction`; its JSON's keys `ANSWERED` are the
        option's own); null where it could not be priced.
      hours: the whole job's hours.
      cost_usd: the whole job's cost: hours x GPUs x the device's price (null: no price).
      reasons: why it is not feasible, one line each (empty: feasible).
      layout: how each count is split (with `global_batch` or `strategies`).
      nodes: the nodes `gpus` fill, where priced (`whole_nodes`).
    """

    device: str
    gpus: int
    prediction: Prediction | None
    hours: float | None = None
    cost_usd: float | None = None
    reasons: list[str] = field(default_factory=list)
    layout: Layout | None = None
    nodes: int | None = None

    @property
    def feasible(self) -> bool:
        """Whether it fits, meets the deadline and the budget (no `reasons`)."""
        return not self.reasons

    @property
    def hours_band(self) -> list[float] | None:
        """The whole job's 80% band, hours (with the prediction's band only)."""
        p = self.prediction
        return [s / 3600 for s in p.job_interval_s] if p and p.job_interval_s else None

    def __str__(self) -> str:
        """One line, as a plan's table row reads: the GPUs, the layout, the job's hours and
        cost, memory and MFU, and why not where it is not feasible."""
        p, where = self.prediction, f"{self.gpus} x {self.device}" + (
            f" ({plural(self.nodes, 'node')})" if self.nodes and self.nodes > 1 else "")
        said = [f"{hours(self.hours)} h" if self.hours is not None else "",
                f"${number(self.cost_usd)}" if self.cost_usd is not None else "",
                f"{number(p.memory_gb)} GB a GPU" + " (tight: may not fit)" * p.tight if p else "",
                f"MFU {percent(p.mfu)}" if p and p.mfu is not None else ""]
        return where + (f" [{self.layout}]" if self.layout else "") + ": " + "; ".join(
            filter(None, [", ".join(filter(None, said)), *self.reasons]))

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # IPython's, Jupyter's
        printer.text(str(self))

    def to_json(self) -> dict:
        p = self.prediction
        d = dict(device=self.device, gpus=self.gpus, nodes=self.nodes, feasible=self.feasible,
                 reasons=self.reasons, hours=self.hours, cost_usd=self.cost_usd)
        if self.layout is not None:
            d.update(layout=dataclasses.asdict(self.layout))
        if p is not None:  # as `Prediction.to_json` says them
            d.update(hours_band=self.hours_band,
                     **{k: getattr(p, DERIVED.get(k, k)) for k in ANSWERED})
        return d


def job_for_plan(**fields) -> TrainingJob:
    """The job a plan prices, from `TrainingJob`'s fields less `gpus` (a plan does not read
    the job's count): set to one every split asked takes, with replicas to shard over, so
    that a count of the plan's that does not take it is listed infeasible, not the request
    refused."""
    split = [fields.get(k, 1) for k in ("tp", "pp", "cp", "ep")]
    if all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in split):
        fields["gpus"] = 2 * math.prod(split)  # else the job's own one-line error
    return TrainingJob(**fields)


@model_errors
def plan(request: Plan, progress: bool = False, limit: int | None = None) -> list[Option]:
    """Every candidate of `request`, ranked (module docstring); `limit`: the most candidates
    (GPU x count, or with `global_batch` layouts, each strategy asked apart) it may price, more
    refused before any is (a service's bound on one request's work)."""

    if len(request.job.batch_sizes) > 1:
        raise RequestError("batch_size: a plan takes one batch size (per data-parallel "
                           "replica; with global_batch, the largest micro-batch)", "batch_size")
    options = (_grid if request.global_batch is None else _search)(request, progress, limit)
    if request.job.precision is None:  # said of each, as `front.predict` says it of a job
        for o in options:
            if o.prediction is not None:
                o.prediction = dataclasses.replace(o.prediction, warnings=[
                    FP32_DEFAULT + GIVE_PRECISION, *o.prediction.warnings])
    return options


def said(options: Sequence[Option]) -> list[str]:
    """The warnings every priced option's prediction says (each once, in their order): the
    job's assumptions and what its pricing did not measure, said once for the plan."""
    ps = [o.prediction for o in options if o.prediction is not None]
    return [w for w in dict.fromkeys(ps[0].warnings) if all(w in p.warnings for p in ps)
            ] if ps else []


def _grid(request: Plan, progress: bool, limit: int | None) -> list[Option]:
    """Every GPU x count asked (no `global_batch`), ranked."""
    job = request.priced
    split = job.tp * job.pp * job.cp

    def odd(n: int) -> str | None:  # why `n` GPUs a node cannot take the job's split
        if n * job.nodes % split:
            return f"{job.split} does not divide {n * job.nodes} GPUs"
        if n * job.nodes // split % job.ep:
            return (f"ep {job.ep} does not divide the {n * job.nodes // split} data-parallel "
                    "replicas")
        return None

    gpus = request.candidates()
    asked = {gpu.name: request.counts(gpu) for gpu in gpus}
    _bounded(sum(not odd(n) for ns in asked.values() for n in ns)
             * max(1, len(request.strategies)), limit, "candidates")
    seq = sequence(cut(job), job.batch_sizes[0], fusion_version(True))  # once for every GPU
    base = dataclasses.replace(job, model=seq, gpus=tuple(
                                   [n for n in request.gpus if not odd(n)] or [split * job.ep]),
                               device_spec=None, checkpoint=None, target_len=None)
    options = []
    for gpu in tqdm(gpus, desc="plan", unit="GPU", disable=not progress, leave=False):
        options += [Option(gpu.name, n * job.nodes, None, reasons=[why])
                    for n in asked[gpu.name] if (why := odd(n))]
        by_nodes: dict[int, list[int]] = {}  # GPUs a node, by the nodes they fill
        for n in (n for n in asked[gpu.name] if not odd(n)):
            if isinstance(s := whole_nodes(gpu, n, job.nodes), str):
                options.append(Option(gpu.name, n * job.nodes, None, reasons=[s]))
            else:
                by_nodes.setdefault(s[1], []).append(s[0])
        if request.strategies:
            options += [_best_strategy(request, dataclasses.replace(
                base, device=gpu.name, nodes=k), gpu, n) for k, ns in by_nodes.items()
                for n in ns]
            continue
        rows = [row for k, ns in by_nodes.items()
                for row in _counts(dataclasses.replace(base, device=gpu.name), ns, k)]
        options += [_judge(Option(gpu.name, n, p, reasons=[error] if error else [],
                                  nodes=k if p else None), request, gpu)
                    for n, k, p, error in rows]
    return sorted(options, key=_rank)


def _counts(job: TrainingJob, ns: list[int], k: int
            ) -> list[tuple[int, int, Prediction | None, str | None]]:
    """(GPUs, nodes, prediction or None, error or None) of `job` on each of `ns` GPUs a node
    over `k` nodes, priced together; where that fails, each count alone (the error may be one
    count's: an offloaded optimizer's strategy over several GPUs; one replica alone as DDP, as
    it is priced among others: nothing to shard)."""
    from mdot_jax.serving.front import predict

    try:
        got = predict(dataclasses.replace(job, gpus=tuple(ns), nodes=k))
    except MdotError as e:
        if len(ns) == 1:
            return [(ns[0] * k, k, None, str(e))]
        return [row for n in ns for row in _counts(job if n * k > job.tp * job.pp * job.cp
                                                   else dataclasses.replace(job, strategy="ddp"),
                                                   [n], k)]
    return [(p.gpus, k, p, None) for p in (got if isinstance(got, list) else [got])]


def _best_strategy(request: Plan, job: TrainingJob, gpu, n: int) -> Option:
    """`job` on `n` GPUs a node priced under each of `request.strategies` it takes (one
    replica: as DDP), the best kept, its strategy in its layout."""
    from mdot_jax.serving.front import predict

    found, why = [], ""
    for strategy in _strategies(request, job, n * job.nodes // (job.tp * job.pp * job.cp)):
        try:
            p = predict(dataclasses.replace(job, gpus=n, strategy=strategy))
        except MdotError as e:  # a strategy the job cannot take (muon's, hsdp with ep)
            why = why or str(e)
            continue
        found.append(_judge(Option(gpu.name, n * job.nodes, p, layout=Layout(  # type: ignore[arg-type]
            job.tp, job.pp, job.batch_sizes[0], job.grad_accum, job.activation_checkpointing,
            job.ep, job.cp, strategy), nodes=job.nodes), request, gpu))
    return min(found, key=_rank) if found else Option(gpu.name, n * job.nodes, None,
                                                      reasons=[why])


def _strategies(request: Plan, job: TrainingJob, replicas: int) -> list[str]:
    """The data-parallel strategies to price `job` under with `replicas`: those asked (one
    replica: nothing to shard, DDP alone), or the job's own."""
    return [s for s in request.strategies if s == "ddp" or replicas > 1] or [job.strategy]


def _bounded(n: int, limit: int | None, what: str) -> None:
    """Refused where `n` `what` (each a step priced) are more than `limit`."""
    if limit is not None and n > limit:
        raise RequestError(f"devices: {n:,} {what} to price, more than the {limit:,} a "
                           "request may; name fewer devices, gpus or strategies" + (
                               ", or a smaller batch_size (fewer micro-batches to try)"
                               if what == "layouts" else ""), "devices")


def _search(request: Plan, progress: bool, limit: int | None = None) -> list[Option]:
    """Every GPU x count x layout the model takes (`Plan.global_batch`), ranked."""
    from mdot_jax.serving.front import keeping_steps

    job = request.priced
    seqs: dict = {}  # the model converted at each micro-batch and cut
    refused: dict[str, tuple[int, str]] = {}  # GPU -> a split the model refused, why
    cuts: dict[tuple[str, int], tuple[int, str]] = {}  # (GPU, a cp asked) -> refused, why
    out: dict[str, tuple[int, str]] = {}  # GPU -> why it cannot run the job at all
    # each GPU in turn for a count and layout, the layouts of a step (its depths) in a row:
    # what is computed of the model at a micro-batch and split is used again while it is kept
    keyed, unfilled = [], []  # (order, gpu, GPUs a node, nodes, layout); counts no nodes take
    for g, gpu in enumerate(request.candidates()):
        for n in request.counts(gpu):
            if isinstance(s := whole_nodes(gpu, n, job.nodes), str):
                unfilled.append(Option(gpu.name, n * job.nodes, None, reasons=[s]))
                continue
            keyed += [((n, lay.cp, lay.tp, lay.micro_batch, lay.pp, g), gpu, *s, lay)
                      for cp in request.cps or (job.cp,) for lay in layouts(
                          *s, request.global_batch, job.batch_sizes[0], cp)]  # type: ignore
    work = [(gpu, n, k, lay) for _, gpu, n, k, lay in sorted(keyed, key=lambda w: w[0])]
    _bounded(len(work) * max(1, len(request.strategies)), limit, "layouts")
    if not work and unfilled:  # no count asked fills whole nodes: each said
        return unfilled
    if not work:
        cps = request.cps or ((job.cp,) if job.cp > 1 else ())
        raise RequestError(f"global_batch {request.global_batch}: no count of GPUs asked "
                           f"({', '.join(str(n * job.nodes) for n in request.gpus)}) splits it "
                           f"into whole micro-batches of 1-{job.batch_sizes[0]} per "
                           "data-parallel replica" + (f" with context parallelism over "
                           f"{' or '.join(map(str, cps))} GPUs" if cps else ""), "global_batch")
    splits = {(n * k, lay.tp, lay.pp) for _, n, k, lay in work}
    for cp in (c for c in request.cps if all(w[3].cp != c for w in work)):  # no count takes
        for name in dict.fromkeys(w[0].name for w in work):
            cuts[name, cp] = (max(n * k for g, n, k, _ in work if g.name == name), (
                f"cp {cp}: no count asked ({', '.join(str(n * job.nodes) for n in request.gpus)})"
                f" splits into whole micro-batches of 1-{job.batch_sizes[0]} per data-parallel "
                f"replica with context parallelism over {cp} GPUs"))
    options: list[Option] = []
    with keeping_steps():  # a step priced once for the pipeline depths built on it
        for gpu, n, k, lay in tqdm(work, desc="plan", unit="layout", disable=not progress,
                                   leave=False):
            if gpu.name in out:
                continue
            try:
                options += _price_layout(request, gpu, n, k, lay, seqs)
            except MdotError as e:  # a split the model refuses is left out; anything else
                split = isinstance(e, RequestError) and e.field in SPLIT_FIELDS
                why = str(e)
                if split and (n * k, 1, 1) not in splits:  # why data parallelism alone is not
                    why = (f"a global batch of {request.global_batch} does not split into whole "
                           f"micro-batches of 1-{job.batch_sizes[0]} over {n * k} "
                           f"data-parallel replicas, and {why}")
                (refused if split else out)[gpu.name] = (n * k, why)  # rules it out
                if isinstance(e, RequestError) and e.field == "cp" and lay.cp > 1:  # (of cps)
                    cuts.setdefault((gpu.name, lay.cp), (n * k, str(e)))
    priced = {o.device for o in options if o.device not in out}
    options = [o for o in options if o.device in priced]
    options += [Option(d, n, None, reasons=[e]) for d, (n, e) in {**refused, **out}.items()
                if d not in priced]  # why, once per GPU
    options += [Option(d, n, None, reasons=[e]) for (d, cp), (n, e) in cuts.items()
                if d in priced and not any(o.device == d and o.layout and o.layout.cp == cp
                                           for o in options)]  # a cp asked, not taken: why
    return sorted(options + unfilled, key=_rank)


def _price_layout(request: Plan, gpu, n: int, nodes: int, lay: Layout, seqs: dict
                  ) -> list[Option]:
    """`lay` of `n` GPUs per node over `nodes` priced, again with full checkpointing where it
    would not fit without (unless the job asks a checkpointing); `seqs`: the model by
    micro-batch and cut."""
    from mdot_jax.serving.front import predict

    job = dataclasses.replace(request.priced, cp=lay.cp, gpus=n, nodes=nodes)  # takes the cut
    key = (lay.micro_batch, lay.cp)
    if key not in seqs:  # converted once per micro-batch and cut
        seqs[key] = sequence(cut(job), lay.micro_batch, fusion_version(True), loss=True)
    seq, moe = seqs[key], seqs[key].meta.get("experts")
    replicas = n * job.nodes // (lay.tp * lay.pp * job.cp)
    eps = [job.ep] if job.ep > 1 or not moe else [
        e for e in (1 << i for i in range(replicas.bit_length()))
        if replicas % e == 0 and moe["experts"] % e == 0]
    ckpts = [job.activation_checkpointing] if job.activation_checkpointing else [None, "full"]
    strategies = _strategies(request, job, replicas)
    found, refused = [], None
    for strategy, ep in ((s, e) for s in strategies for e in eps):
        for ckpt in ckpts:
            try:
                p = predict(dataclasses.replace(
                    job, model=seq, batch_size=lay.micro_batch, gpus=n, device=gpu.name,
                    device_spec=None, checkpoint=None, target_len=None, tp=lay.tp, pp=lay.pp,
                    ep=ep, grad_accum=lay.grad_accum, activation_checkpointing=ckpt,
                    strategy=strategy))
            except RequestError as e:  # a strategy the job cannot take (muon's, hsdp with ep)
                if len(strategies) == 1 or e.field not in ("strategy", "ep", "optimizer"):
                    raise
                refused = refused or e
                break
            o = _judge(Option(gpu.name, n * job.nodes, p,  # type: ignore[arg-type]
                              layout=dataclasses.replace(lay, checkpointing=ckpt, ep=ep,
                                                         strategy=strategy),
                              nodes=job.nodes), request, gpu)
            if o.feasible or ckpt == ckpts[-1] or not any("fit" in r for r in o.reasons):
                found.append(o)
                break
    if not found and refused:
        raise refused
    return [min(found, key=_rank)] if found else []


def _judge(o: Option, request: Plan, gpu) -> Option:
    p = o.prediction
    if p is None:
        return o
    o.hours = p.job_s / 3600 if p.job_s is not None else None
    usd = request.price_of(gpu)
    o.cost_usd = o.hours * o.gpus * usd if usd is not None and o.hours is not None else None
    if not p.fits:
        search = "" if request.global_batch is not None else (
            "; global_batch searches smaller micro-batches, tensor and pipeline splits, "
            "checkpointing")
        strategy = o.layout.strategy if o.layout is not None else request.job.strategy
        if strategy == "ddp" and p.replicas > 1:  # each replica keeps all state
            search += "; strategy fsdp shards the weights, gradients and optimizer state" + (
                " (hsdp: within each node)" if request.job.nodes > 1 else "")
        o.reasons.append(f"does not fit in the {gpu.name}'s {gpu.memory_gb:g} GB "
                         f"({number(p.memory_gb)} GB per GPU{search})")
    elif request.roomy and p.tight:
        o.reasons.append(f"{number(p.memory_gb)} GB per GPU may not fit in the {gpu.name}'s "
                         f"{gpu.memory_gb:g} GB (roomy: a tenth kept free)")
    if (free := request.free_of(gpu)) is not None and o.gpus > free:
        o.reasons.append(f"{plural(o.gpus, 'GPU')}: {free} free (available)")
    if request.deadline_h is not None and o.hours is not None and o.hours > request.deadline_h:
        o.reasons.append(f"{hours(o.hours)} h: past the deadline ({request.deadline_h:g} h)")
    if request.budget_usd is not None:
        if o.cost_usd is None:
            o.reasons.append(f"no price for the {gpu.name} (prices) to hold to the budget")
        elif o.cost_usd > request.budget_usd:
            o.reasons.append(f"${number(o.cost_usd)}: over the budget "
                             f"(${number(request.budget_usd)})")
    return o


# a job twice as soon is worth 1% more cost, and twice the GPUs must be 1% sooner: below what a
# prediction tells apart, the other measure decides
WORTH = math.log(1.01) / math.log(2)


def _rank(o: Option) -> tuple:
    """Feasible first; then by cost, time weighing `WORTH` (unknown: after the priced, by
    time, GPUs weighing `WORTH`); the unpriced last."""
    if o.prediction is None or o.hours is None:
        return (not o.feasible, 2, 0.0)
    if o.cost_usd is not None:
        return (not o.feasible, 0, math.log(o.cost_usd) + WORTH * math.log(o.hours))
    return (not o.feasible, 1, math.log(o.hours) + WORTH * math.log(o.gpus))


def pareto(options: Sequence[Option], feasible: bool = True) -> list[Option]:
    """The (`feasible`) options with a cost that no other beats on both time and cost, by
    time."""
    priced = sorted((o for o in options if (o.feasible or not feasible) and o.cost_usd is not
                     None and o.hours is not None), key=lambda o: (o.hours, o.cost_usd))
    front: list[Option] = []
    for o in priced:
        if not front or o.cost_usd < front[-1].cost_usd:  # type: ignore[operator]
            front.append(o)
    return front
